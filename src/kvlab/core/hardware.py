"""The machine's accelerators: whether a GPU is visible, the evidence for it, and how its
memory relates to the host's.

Every probe only looks (no process is started but `nvidia-smi`, nothing is written), and takes
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
_NO_MEMORY = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")


@dataclass(frozen=True)
class Hardware:
    """Whether a GPU is visible, the evidence for it, and unified vs discrete memory."""

    gpu: bool
    evidence: str  # what was seen: "nvidia-smi -L lists 1 GPU", "/dev/nvidia0 exists", ...
    memory: str = "unknown"  # "unified", "discrete", "none" (no GPU) or "unknown"
    gpus: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "gpus": list(self.gpus)}


UNDETECTED = Hardware(gpu=False, evidence="not detected", memory="unknown")


def _nvidia_smi(*args: str) -> str | None:
    """`nvidia-smi ARGS`'s output, or None when it is absent, fails or hangs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        run = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout if run.returncode == 0 else None


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
                        memory_kind(query) if query else "unknown", gpus)
    if (dev / "nvidia0").exists():
        return Hardware(True, f"{dev / 'nvidia0'} exists (nvidia-smi did not list it)")
    why = "nvidia-smi lists none" if listed is not None else "no nvidia-smi"
    return Hardware(False, f"no GPU visible ({why}, no {dev / 'nvidia0'})", "none")


