"""Byte counters of the link: a network interface (psutil) and RDMA ports (sysfs).

Interface counters come from psutil, which reads /proc/net/dev on Linux and the routing
socket on macOS, the same numbers the seed's run-load.sh took from /proc/net/dev and
`netstat -ib`. RDMA (InfiniBand, RoCE, UCX rc/ud) bypasses the kernel's network stack, so
those bytes never show in an interface's counters: they are read from
/sys/class/infiniband/<dev>/ports/<port>/counters/port_{rcv,xmit}_data. Those counters count
4-byte words; where the `_ext` form of a counter exists it is preferred and taken as bytes,
following the engine facts (shared/engines/FACTS.md section 9 and 2.6). A 32-bit counter
stuck at its maximum has saturated (InfiniBand counters stop rather than wrap), which is
reported rather than turned into a wrong delta.

This module reads counters and subtracts them (one interface, or every interface at once, and
which interface holds an address); it does not decide what the bytes mean.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from kvlab.core import InputError
from kvlab.records import RdmaCounters, RdmaPortDelta

INFINIBAND_ROOT = Path("/sys/class/infiniband")
WORD_BYTES = 4
SATURATED_32 = 2**32 - 1


@dataclass(frozen=True)
class IfaceCounters:
    iface: str
    rx_bytes: int
    tx_bytes: int


def interfaces() -> list[str]:
    """Names of this machine's network interfaces."""
    return sorted(psutil.net_io_counters(pernic=True))


def read_iface(iface: str) -> IfaceCounters | None:
    """Received and transmitted bytes of one interface; None when it does not exist."""
    if not iface:
        return None
    found = psutil.net_io_counters(pernic=True, nowrap=True).get(iface)
    if found is None:
        return None
    return IfaceCounters(iface, int(found.bytes_recv), int(found.bytes_sent))


def require_iface(iface: str) -> None:
    """Refuse a CLUSTER_IFACE this machine does not have, naming the ones it has."""
    if iface and read_iface(iface) is None:
        raise InputError(f"CLUSTER_IFACE={iface!r} is not an interface on this machine; "
                         f"choose one of {', '.join(interfaces())} (or leave it empty)")


@dataclass(frozen=True)
class RdmaPort:
    """One RDMA port's data counters, converted to bytes."""

    name: str  # "<device>/<port>"
    rx_bytes: int
    tx_bytes: int
    units: str  # "bytes (_ext)" or "4-byte words"
    saturated: bool = False


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _counter(counters: Path, name: str) -> tuple[int, bool, bool] | None:
    """(bytes, from _ext, saturated) for counter `name` in a port's counters directory."""
    ext = _read_int(counters / f"{name}_ext")
    if ext is not None:
        return ext, True, False
    words = _read_int(counters / name)
    if words is None:
        return None
    return words * WORD_BYTES, False, words == SATURATED_32


def read_rdma(root: Path = INFINIBAND_ROOT) -> dict[str, RdmaPort]:
    """Every RDMA port's byte counters under `root` (empty when there is no RDMA)."""
    out: dict[str, RdmaPort] = {}
    if not root.is_dir():
        return out
    for counters in sorted(root.glob("*/ports/*/counters")):
        rcv = _counter(counters, "port_rcv_data")
        xmit = _counter(counters, "port_xmit_data")
        if rcv is None or xmit is None:
            continue
        name = f"{counters.parents[2].name}/{counters.parent.name}"
        units = "bytes (_ext)" if rcv[1] and xmit[1] else "4-byte words"
        out[name] = RdmaPort(name, rcv[0], xmit[0], units, rcv[2] or xmit[2])
    return out


def iface_delta(before: IfaceCounters | None,
                after: IfaceCounters | None) -> tuple[int | None, int | None]:
    """rx/tx bytes moved between two readings (None when either reading is missing)."""
    if before is None or after is None:
        return None, None
    return after.rx_bytes - before.rx_bytes, after.tx_bytes - before.tx_bytes


def rdma_delta(before: dict[str, RdmaPort], after: dict[str, RdmaPort]) -> RdmaCounters | None:
    """Per-port and total RDMA bytes moved (None: no port in both readings)."""
    ports = {name: RdmaPortDelta(rx_bytes=max(end.rx_bytes - start.rx_bytes, 0),
                                 tx_bytes=max(end.tx_bytes - start.tx_bytes, 0),
                                 units=end.units, saturated=start.saturated or end.saturated)
             for name, end in after.items() if (start := before.get(name)) is not None}
    if not ports:
        return None
    return RdmaCounters(ports=ports, rx_bytes=sum(p.rx_bytes for p in ports.values()),
                        tx_bytes=sum(p.tx_bytes for p in ports.values()),
                        saturated=any(p.saturated for p in ports.values()))


def read_all() -> dict[str, IfaceCounters]:
    """Every interface's received and transmitted bytes, by name."""
    found = psutil.net_io_counters(pernic=True, nowrap=True)
    return {name: IfaceCounters(name, int(c.bytes_recv), int(c.bytes_sent))
            for name, c in found.items()}


def all_deltas(before: dict[str, IfaceCounters],
               after: dict[str, IfaceCounters]) -> dict[str, int]:
    """Bytes each interface moved (received plus transmitted) between two readings."""
    return {name: (end.rx_bytes - before[name].rx_bytes) + (end.tx_bytes - before[name].tx_bytes)
            for name, end in after.items() if name in before}


def addresses_of(addr: str) -> tuple[str, ...]:
    """The IP addresses `addr` names: itself when it is one, else what it resolves to here
    (none when it does not resolve), without IPv6 zone suffixes."""
    try:
        return (str(ipaddress.ip_address(addr)),)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(addr, None)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))


def iface_addresses() -> dict[str, tuple[str, ...]]:
    """This machine's interfaces and their IPv4/IPv6 addresses (no IPv6 zone suffix)."""
    families = (socket.AF_INET, socket.AF_INET6)
    return {name: tuple(a.address.split("%")[0] for a in addrs if a.family in families)
            for name, addrs in psutil.net_if_addrs().items()}


def iface_holding(addresses: tuple[str, ...]) -> str | None:
    """The interface of this machine that holds one of `addresses` (None: none does)."""
    return next((name for name, held in sorted(iface_addresses().items())
                 if set(held) & set(addresses)), None)
