"""What this machine offers vLLM: a visible GPU, how its memory relates to the host's, the host
memory a KV tier can take, and the interface a connector's side channel resolves to.

Every probe here only looks (no process is started but `nvidia-smi`, nothing is written), and
every check takes its figures as arguments, so a test passes a machine in instead of patching
the real one. Deliberately not here: choosing a vLLM build (`selection.py`) or a plan.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvlab.core.errors import RefusedError
from kvlab.observe import netdev

GIB = 2**30
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

    def as_dict(self) -> dict[str, Any]:
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


# --- host memory for the KV tier ------------------------------------------------------------
@dataclass(frozen=True)
class HostMemory:
    """Host memory right now, in bytes."""

    available: int
    swap_free: int
    total: int

    @classmethod
    def now(cls) -> HostMemory:
        import psutil

        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        return cls(int(vm.available), int(swap.free), int(vm.total))


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_offload_memory(tier_gib: float, memory: HostMemory, *, unified: bool,
                         device_fraction: float, allow_swap: bool) -> dict[str, Any]:
    """Refuse a host tier larger than the memory available for it; the figures compared.

    On unified memory the engine's own share (its memory fraction of the one pool) is taken
    from the same memory after this check runs, so it is counted against the tier too.
    """
    tier = int(tier_gib * GIB)
    engine_share = int(device_fraction * memory.total) if unified else 0
    room = memory.available - engine_share
    figures = {"tier_bytes": tier, "available_bytes": memory.available,
               "swap_free_bytes": memory.swap_free, "engine_share_bytes": engine_share,
               "fits": tier <= room, "allowed_by": "KV_OFFLOAD_ALLOW_SWAP" if allow_swap else None}
    if tier <= room or allow_swap:
        return figures
    share = (f" after the engine's own {_gib(engine_share)} of this unified memory"
             if unified else "")
    swap = (f"; the rest would come from swap ({_gib(memory.swap_free)} free), which is slower "
            "than no tier" if memory.swap_free else "; there is no swap to take the rest")
    raise RefusedError(
        f"KV_OFFLOAD_GB={tier_gib:g} asks for {_gib(tier)} of host memory but "
        f"{_gib(max(room, 0))} is available{share}{swap}: lower KV_OFFLOAD_GB, or set "
        "KV_OFFLOAD_ALLOW_SWAP=1 to start it anyway")


# --- the side channel -----------------------------------------------------------------------
def side_channel(addr: str, port: int, cluster_iface: str,
                 ifaces: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """Where a NIXL side channel will listen: the address, what it resolves to, its interface."""
    ifaces = netdev.iface_addresses() if ifaces is None else ifaces
    resolved = netdev.addresses_of(addr)
    on = sorted(name for name, addrs in ifaces.items() if set(resolved) & set(addrs))
    facts: dict[str, Any] = {"addr": addr, "port": port, "resolves_to": list(resolved),
                             "iface": on[0] if on else None, "cluster_iface": cluster_iface}
    if not resolved:
        facts["note"] = f"SIDE_CHANNEL_ADDR {addr} does not resolve on this machine"
    elif not on:
        facts["note"] = f"SIDE_CHANNEL_ADDR {addr} is not an address of this machine"
    elif cluster_iface and cluster_iface not in on:
        facts["note"] = (f"SIDE_CHANNEL_ADDR {addr} is on {on[0]}, not CLUSTER_IFACE "
                         f"{cluster_iface}: the handshake crosses another network")
    return facts
