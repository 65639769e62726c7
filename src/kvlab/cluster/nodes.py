"""A Ray cluster's nodes as data, and a host name resolved to exactly one of them.

The names are the seed's: PREFILL_HOST and DECODE_HOST (or `--node NAME`) name a machine as
the other machines resolve it. A name matches a live node by its address (as written, or what
the name resolves to here), its host name (whole or its first label), its node id (whole or a
prefix of at least 6 characters), or its `kvlab-host` label (`ray start --labels
kvlab-host=NAME`: how two nodes on one machine get names of their own). A `-direct` name
(`node-a-direct.home.arpa`) matches the node `node-a` and chooses the cable: the engines on
that node listen on the address the `-direct` name resolves to, which the node's agent checks
it holds. No match, or more than one, is refused naming the host and listing every node.

This module does not talk to Ray: it reads `ray.nodes()`'s entries as they are given.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvlab.core import RefusedError
from kvlab.observe import netdev

LABEL = "kvlab-host"  # a node label naming the node, for several nodes on one machine
DIRECT = "-direct"  # the seed's suffix for a machine's name on its direct cable
MIN_ID_PREFIX = 6

Lookup = Callable[[str], tuple[str, ...]]


@dataclass(frozen=True)
class Node:
    """One node as Ray lists it."""

    node_id: str
    address: str
    hostname: str
    labels: dict[str, str] = field(default_factory=dict)
    alive: bool = True
    gpus: int = 0  # the node's GPU resource (its `ray start --num-gpus`, or what Ray found)

    @property
    def short_id(self) -> str:
        return self.node_id[:8]

    @property
    def name(self) -> str:
        """How kvlab names the node in messages: its label, else its host name, with its id."""
        own = self.labels.get(LABEL)
        return f"{own or self.hostname} [{self.short_id}]"

    def listing(self) -> str:
        label = f", {LABEL}={self.labels[LABEL]}" if LABEL in self.labels else ""
        return f"{self.hostname} {self.address} [{self.short_id}]{label}"


@dataclass(frozen=True)
class Resolved:
    """A host name and the node it names."""

    setting: str  # PREFILL_HOST, DECODE_HOST, --node, --proxy-node
    name: str  # as written
    node: Node
    bind: str  # the address the node's engines listen on (the cable's, for a -direct name)
    matched_by: str
    direct: bool = False


def from_ray(entries: Iterable[dict[str, object]]) -> list[Node]:
    """`ray.nodes()` entries as nodes (dead ones kept, marked, for the listing)."""
    out = []
    for e in entries:
        labels = {str(k): str(v) for k, v in _mapping(e.get("Labels")).items()
                  if not str(k).startswith("ray.io/")}
        gpus = _mapping(e.get("Resources")).get("GPU", 0)
        out.append(Node(node_id=str(e["NodeID"]), address=str(e["NodeManagerAddress"]),
                        hostname=str(e.get("NodeManagerHostname") or e["NodeManagerAddress"]),
                        labels=labels, alive=bool(e.get("Alive", True)),
                        gpus=int(gpus) if isinstance(gpus, int | float) else 0))
    return out


def _mapping(value: object) -> dict[object, object]:
    return value if isinstance(value, dict) else {}


def undirected(name: str) -> tuple[str, bool]:
    """`node-a-direct.home.arpa` -> (`node-a.home.arpa`, True); other names unchanged."""
    first, dot, rest = name.partition(".")
    if first.lower().endswith(DIRECT) and len(first) > len(DIRECT):
        return first[: -len(DIRECT)] + dot + rest, True
    return name, False


def _by_name(node: Node, names: set[str]) -> str | None:
    hostname = node.hostname.lower()
    if node.labels.get(LABEL, "").lower() in names:
        return f"its {LABEL} label"
    if hostname in names or hostname.split(".")[0] in names:
        return "its host name"
    ident = node.node_id.lower()
    if any(n == ident or (len(n) >= MIN_ID_PREFIX and ident.startswith(n)) for n in names):
        return "its node id"
    return None


def _matches(node: Node, name: str, addresses: tuple[str, ...]) -> str | None:
    if _is_address(name):
        return "its address" if node.address == name else None
    base, _ = undirected(name)
    names = {n.lower() for n in (name, base, name.split(".")[0], base.split(".")[0])}
    named = _by_name(node, names)
    if named:
        return named
    if node.address in (name, *addresses):
        return "its address"
    return None


def resolve(setting: str, name: str, nodes: list[Node], where: str,
            lookup: Lookup = netdev.addresses_of) -> Resolved:
    """The one live node `name` names; refused (naming the host, listing the nodes) if none or
    several do. `where` is the cluster's address, for the message."""
    live = [n for n in nodes if n.alive]
    addresses = lookup(name)
    found = [(n, how) for n in live if (how := _matches(n, name, addresses))]
    if not found:
        raise RefusedError(
            f"{setting}={name} matches no node of the Ray cluster at {where}; its nodes: "
            f"{listing(nodes)}. Give a node's address, host name, node id, or its {LABEL} "
            f"label (ray start --labels {LABEL}=NAME)")
    if len(found) > 1:
        raise RefusedError(
            f"{setting}={name} matches {len(found)} nodes of the Ray cluster at {where} "
            f"({listing([n for n, _ in found])}); name one by its node id or its {LABEL} label")
    node, how = found[0]
    _, direct = undirected(name)
    bind = node.address
    if direct:  # the name chooses the cable: listen on the address it resolves to
        cable = [a for a in addresses if not _loopback(a)]
        if not cable:
            raise RefusedError(f"{setting}={name} does not resolve to an address here; a "
                               f"{DIRECT} name must resolve to the machine's address on its "
                               "direct cable (/etc/hosts or DNS)")
        bind = cable[0]
    return Resolved(setting, name, node, bind, how, direct)


def listing(nodes: list[Node]) -> str:
    shown = [n.listing() + ("" if n.alive else " (dead)") for n in nodes]
    return "; ".join(shown) if shown else "none"


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
