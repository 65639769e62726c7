"""What this machine offers vLLM: whether the host memory (`core/hardware.HostMemory`) can take
a KV tier, and the interface a connector's side channel resolves to.

Every probe here only looks (no process is started but `nvidia-smi`, nothing is written), and
every check takes its figures as arguments, so a test passes a machine in instead of patching
the real one. Deliberately not here: choosing a vLLM build (`selection.py`) or a plan.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvlab.core import HostMemory, RefusedError
from kvlab.observe import netdev
from kvlab.records import HostTierCheck, SideChannelAddress

GIB = 2**30


# --- host memory for the KV tier ------------------------------------------------------------
def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_offload_memory(tier_gib: float, memory: HostMemory, *, unified: bool,
                         device_fraction: float, allow_swap: bool) -> HostTierCheck:
    """Refuse a host tier larger than the memory available for it; the figures compared.

    On unified memory the engine's own share (its memory fraction of the one pool) is taken
    from the same memory after this check runs, so it is counted against the tier too.
    """
    tier = int(tier_gib * GIB)
    engine_share = int(device_fraction * memory.total) if unified else 0
    room = memory.available - engine_share
    figures = HostTierCheck(tier_bytes=tier, available_bytes=memory.available,
                            swap_free_bytes=memory.swap_free, engine_share_bytes=engine_share,
                            fits=tier <= room,
                            allowed_by="KV_OFFLOAD_ALLOW_SWAP" if allow_swap else None)
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
                 ifaces: Mapping[str, tuple[str, ...]] | None = None) -> SideChannelAddress:
    """Where a NIXL side channel will listen: the address, what it resolves to, its interface."""
    ifaces = netdev.iface_addresses() if ifaces is None else ifaces
    resolved = netdev.addresses_of(addr)
    on = sorted(name for name, addrs in ifaces.items() if set(resolved) & set(addrs))
    note = None
    if not resolved:
        note = f"SIDE_CHANNEL_ADDR {addr} does not resolve on this machine"
    elif not on:
        note = f"SIDE_CHANNEL_ADDR {addr} is not an address of this machine"
    elif cluster_iface and cluster_iface not in on:
        note = (f"SIDE_CHANNEL_ADDR {addr} is on {on[0]}, not CLUSTER_IFACE {cluster_iface}: "
                "the handshake crosses another network")
    return SideChannelAddress(addr=addr, port=port, resolves_to=list(resolved),
                              iface=on[0] if on else None, cluster_iface=cluster_iface, note=note)
