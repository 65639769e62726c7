"""The machine's accelerators: whether a GPU is visible (NVIDIA, or AMD through ROCm), the
evidence for it, and how its memory relates to the host's.

Every probe only looks (no process is started but `nvidia-smi`, `amd-smi` or `rocm-smi`,
nothing is written), and takes
the environment and /dev as arguments, so a test passes a machine in instead of patching the
real one. Deliberately not here: which engine build runs on it (`engines/vllm/selection.py`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

DEV = Path("/dev")
# GPUs whose memory IS the host's (one pool, no copy between them). DGX Spark's GB10 and the
# Jetson/Thor modules; nvidia-smi reports no memory.total of their own for most of them.
# (GH200/GB200 are not here: their HBM is separate memory, coherent with the Grace CPU's.)
UNIFIED_GPU_NAMES = ("GB10", "Jetson", "Orin", "Thor")
# AMD APUs, whose GPU shares the host's memory: Strix Halo (Ryzen AI Max+, Radeon 8060S/8050S,
# gfx1151), Strix Point (Radeon 890M/880M, gfx1150), Phoenix/Hawk Point (Radeon 780M, gfx1103),
# and the MI300A (its HBM is the CPU's memory too). A name or gfx target from amd-smi/rocm-smi.
UNIFIED_AMD_MARKS = ("8060S", "8050S", "890M", "880M", "780M", "760M", "Strix", "Ryzen AI",
                     "MI300A", "gfx1151", "gfx1150", "gfx1103")
_NO_MEMORY = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")


@dataclass(frozen=True)
class Hardware:
    """Whether a GPU is visible, the evidence for it, and unified vs discrete memory."""

    gpu: bool
    evidence: str  # what was seen: "nvidia-smi -L lists 1 GPU", "/dev/nvidia0 exists", ...
    memory: str = "unknown"  # "unified", "discrete", "none" (no GPU) or "unknown"
    gpus: tuple[str, ...] = ()
    vendor: str = "none"  # "nvidia", "amd" or "none"

    @property
    def platform(self) -> str:
        """What a GPU build of an engine runs on here: "cuda", "rocm", or "cpu"."""
        return {"nvidia": "cuda", "amd": "rocm"}.get(self.vendor, "cpu")

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "gpus": list(self.gpus)}


UNDETECTED = Hardware(gpu=False, evidence="not detected", memory="unknown")


def _nvidia_smi(*args: str) -> str | None:
    """`nvidia-smi ARGS`'s output, or None when it is absent, fails or hangs."""
    return _tool("nvidia-smi", *args)


def _tool(name: str, *args: str) -> str | None:
    """`NAME ARGS`'s output, or None when it is absent, fails or hangs."""
    exe = shutil.which(name)
    if exe is None:
        return None
    try:
        run = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout if run.returncode == 0 else None


def cuda_architecture() -> str | None:
    """The first NVIDIA GPU's compute capability as CUDA names an architecture ("90" for an
    H100/H200's 9.0), from `nvidia-smi --query-gpu=compute_cap`; None when it cannot say."""
    text = _nvidia_smi("--query-gpu=compute_cap", "--format=csv,noheader")
    first = (text or "").strip().splitlines()[:1]
    digits = first[0].strip().replace(".", "") if first else ""
    return digits if digits.isdigit() else None


def device_memory_bytes() -> int | None:
    """The first NVIDIA GPU's memory, from `nvidia-smi --query-gpu=memory.total` (MiB); None
    when it cannot say (no nvidia-smi, a unified-memory GPU that reports none)."""
    text = _nvidia_smi("--query-gpu=memory.total", "--format=csv,noheader,nounits")
    first = (text or "").strip().splitlines()[:1]
    mib = first[0].strip() if first else ""
    return int(mib) * 2**20 if mib.isdigit() else None


def memory_kind(query_csv: str) -> str:
    """unified or discrete, from `nvidia-smi --query-gpu=name,memory.total --format=csv,...`."""
    kinds = set()
    for line in query_csv.strip().splitlines():
        name, _, total = (part.strip() for part in line.rpartition(","))
        unified = total in _NO_MEMORY or any(n.lower() in name.lower()
                                              for n in UNIFIED_GPU_NAMES)
        kinds.add("unified" if unified else "discrete")
    return kinds.pop() if len(kinds) == 1 else "unknown"


def detect_hardware(env: Mapping[str, str] | None = None, dev: Path = DEV) -> Hardware:
    """A visible NVIDIA GPU: `nvidia-smi -L` lists one, else `/dev/nvidia0` exists (a
    container without nvidia-smi). CUDA_VISIBLE_DEVICES set empty or to -1 hides them all."""
    env = os.environ if env is None else env
    hidden = env.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return Hardware(False, f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU", "none")
    listed = _nvidia_smi("-L")
    gpus = tuple(ln.strip() for ln in (listed or "").splitlines() if ln.startswith("GPU "))
    if gpus:
        query = _nvidia_smi("--query-gpu=name,memory.total", "--format=csv,noheader,nounits")
        return Hardware(True, f"nvidia-smi -L lists {len(gpus)} GPU(s)",
                        memory_kind(query) if query else "unknown", gpus, "nvidia")
    if (dev / "nvidia0").exists():
        return Hardware(True, f"{dev / 'nvidia0'} exists (nvidia-smi did not list it)",
                        vendor="nvidia")
    amd = detect_amd(env, dev)
    if amd is not None:
        return amd
    why = "nvidia-smi lists none" if listed is not None else "no nvidia-smi"
    return Hardware(False, f"no GPU visible ({why}, no {dev / 'nvidia0'}, no {dev / 'kfd'})",
                    "none")


AMD_HIDING = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def detect_amd(env: Mapping[str, str], dev: Path = DEV) -> Hardware | None:
    """An AMD GPU through ROCm: `amd-smi` (or the older `rocm-smi`) names one, else the ROCm
    device nodes exist (/dev/kfd and a /dev/dri/renderD*). None: no AMD GPU visible."""
    for name in AMD_HIDING:
        hidden = env.get(name)
        if hidden is not None and hidden.strip() in ("", "-1"):
            return Hardware(False, f"{name}={hidden!r} hides every AMD GPU", "none")
    names = amd_gpu_names()
    if names:
        kinds = {"unified" if any(m.lower() in n.lower() for m in UNIFIED_AMD_MARKS)
                 else "discrete" for n in names}
        return Hardware(True, f"amd-smi/rocm-smi names {len(names)} AMD GPU(s)",
                        kinds.pop() if len(kinds) == 1 else "unknown", tuple(names), "amd")
    renders = sorted((dev / "dri").glob("renderD*")) if (dev / "dri").is_dir() else []
    if (dev / "kfd").exists() and renders:
        return Hardware(True, f"{dev / 'kfd'} and {renders[0]} exist (ROCm's device nodes; "
                        "no amd-smi or rocm-smi named the GPU)", vendor="amd")
    return None


def amd_gpu_names() -> list[str]:
    """Each AMD GPU's market name and gfx target, from `amd-smi static --asic --json`, else
    `rocm-smi --showproductname --json` (empty when neither answers)."""
    text = _tool("amd-smi", "static", "--asic", "--json")
    found = _json(text)
    if isinstance(found, dict):
        found = found.get("gpu_data", [found])
    if isinstance(found, list):
        names = [" ".join(str(asic.get(k, "")) for k in ("market_name",
                                                          "target_graphics_version")).strip()
                 for gpu in found if isinstance(gpu, dict)
                 and isinstance(asic := gpu.get("asic"), dict)]
        if any(names):
            return [n for n in names if n]
    cards = _json(_tool("rocm-smi", "--showproductname", "--json"))
    if isinstance(cards, dict):
        return [" ".join(str(card.get(k, "")) for k in ("Card Series", "Card Model",
                                                         "GFX Version")).strip()
                for key, card in cards.items() if key.startswith("card")
                and isinstance(card, dict)]
    return []


def _json(text: str | None) -> object:
    import json

    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class HostMemory:
    """Host memory right now, in bytes (what a host-memory KV tier can take)."""

    available: int
    swap_free: int
    total: int

    @classmethod
    def now(cls) -> HostMemory:
        import psutil

        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        return cls(int(vm.available), int(swap.free), int(vm.total))
