"""After a point-to-point (NIXL, Mooncake) run: did the traffic cross the side channel's
network, or another one?

The P/D lab's diagnosis for a SIDE_CHANNEL_ADDR on a management address ("a pair that works
and is slow, and nothing in any log says so"): the interface counters on the cable show
nothing while the counters on the management interface show everything. So around the run
every interface's bytes are read; afterwards the interface SIDE_CHANNEL_ADDR resolves to is
compared with CLUSTER_IFACE and with the interface that moved the most bytes, and the finding
is stated in words. RDMA bypasses the interface counters; when RDMA ports moved bytes, that
is said beside it. Only this machine's interfaces can be read: an address that is not this
machine's is reported as uncheckable here, never guessed.
"""

from __future__ import annotations

from kvlab.core import human_bytes
from kvlab.observe import netdev
from kvlab.records import SideChannel

MANAGEMENT = ("a side channel on a management address works and is slow, and nothing in any "
              "log says so")


def check(addr: str, cluster_iface: str, moved: dict[str, int],
          rdma_bytes: int | None = None) -> SideChannel:
    """The side-channel finding for the link record: where the address lives, the bytes each
    interface moved during the run, and a verdict in words."""
    resolved = netdev.addresses_of(addr)
    iface = netdev.iface_holding(resolved) if resolved else None
    busy = {name: n for name, n in sorted(moved.items(), key=lambda kv: -kv[1]) if n > 0}
    verdict = _verdict(addr, iface, cluster_iface, busy, bool(resolved))
    if rdma_bytes:
        verdict += (f"; RDMA ports moved {human_bytes(rdma_bytes)}, which no interface counter "
                    "shows")
    return SideChannel(addr=addr, resolves_to=list(resolved), iface=iface,
                       cluster_iface=cluster_iface or None, bytes_by_iface=busy,
                       iface_bytes=moved.get(iface) if iface else None, verdict=verdict)


def _verdict(addr: str, iface: str | None, cluster: str, busy: dict[str, int],
             resolved: bool) -> str:
    if not resolved:
        return f"SIDE_CHANNEL_ADDR {addr} does not resolve on this machine: not checked"
    if iface is None:
        return (f"SIDE_CHANNEL_ADDR {addr} is not an address of this machine, so its interface "
                "counters cannot be read here: run the check on the machine that advertises it")
    mine = busy.get(iface, 0)
    top = next(iter(busy), None)
    said = f"SIDE_CHANNEL_ADDR {addr} is on {iface}, which moved {human_bytes(mine)}"
    if cluster and cluster != iface:
        on_cable = busy.get(cluster, 0)
        worse = (f": the traffic took {iface}, not the cable; {MANAGEMENT}; set "
                 f"SIDE_CHANNEL_ADDR to this machine's address on {cluster}"
                 if mine > on_cable else "")
        return (f"{said}, not CLUSTER_IFACE {cluster}, which moved {human_bytes(on_cable)}"
                + worse)
    if top is None:
        return f"{said}; no interface moved any bytes during the run"
    if top != iface:
        return (f"{said}, but {top} moved the most, {human_bytes(busy[top])}: the traffic "
                f"crossed {top}, not the side channel's network; {MANAGEMENT}")
    return f"{said}, the most of any interface: the traffic took the side channel's network"
