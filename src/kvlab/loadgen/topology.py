"""Where a load run's pieces ran, as every load and link row records it.

The fields, the same from `kvlab run disagg`, `kvlab run-load` and `kvlab load`:
`topology` ("loopback": prefill and decode on one machine; "two machines"; "one instance":
no split; "unknown"), `single_machine` (prefill, decode and proxy on one machine; None
when not known),
`hosts` (role -> host as written, "unknown" where not known), `connector`, `link`
("loopback", the cluster interface, or "unknown"), `topology_from` (how it was known),
`placement` ("local": kvlab started everything on this machine; "ray": on the nodes of a Ray
cluster; "manual": started by hand), `nodes` (Ray only: role -> node id, host name, address,
machine id, the interface holding the address and its link speed), `same_machine` (prefill
and decode on one machine: by machine id on Ray; None when not known or not a split) and
`link_speed_mbps` (the speed of the interface that carried the split's traffic, where known).

On Ray the machines are told apart by machine id, never by name: two Ray nodes on one machine
are "loopback", one machine, whatever their names, and `topology_from` says "two Ray nodes on
one machine".

An experiment that started every process knows its topology. A manual run knows only what
the URL and the settings say: the URL's host; whether the URL is the proxy (kvlab's proxy
names its legs at /health; otherwise the URL's port being PROXY_PORT); and, behind a proxy,
PREFILL_HOST/DECODE_HOST, which the seed's run-proxy.sh reads as loopback when empty. Hosts
are compared as written (no DNS): a loopback name is the proxy's own machine, this machine's
own name and addresses are this machine, and two other names count as two machines.
Everything else is "unknown", never a guess.
The report places rows by these fields alone.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from kvlab.records import (
    LOCAL,
    LOOPBACK,
    MANUAL,
    ONE_INSTANCE,
    RAY,
    RAY_ONE_MACHINE,
    RAY_TWO_MACHINES,
    TOPOLOGY_FIELDS,
    TWO_MACHINES,
    UNKNOWN,
    NodeInfo,
    Where,
)

FIELDS = TOPOLOGY_FIELDS
__all__ = ["FIELDS", "LOCAL", "LOOPBACK", "MANUAL", "ONE_INSTANCE", "RAY", "TWO_MACHINES",
           "UNKNOWN", "Known", "derive", "loopback_split", "one_instance", "proxy_legs",
           "ray_instance", "ray_split", "same_machine", "unknown"]


@dataclass(frozen=True)
class Known:
    """What settings say about the split (the seed's .env names)."""

    connector: str = UNKNOWN
    prefill_host: str = ""
    decode_host: str = ""
    proxy_port: int | None = None
    cluster_iface: str = ""
    legs: dict[str, list[str]] = field(default_factory=dict)  # from the proxy's /health


def url_host(url: str) -> str:
    return urlsplit(url).hostname or UNKNOWN


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_split(connector: str, how: str, host: str = "127.0.0.1") -> Where:
    """Prefill, decode and proxy all on one machine (kvlab run disagg)."""
    return Where(topology=LOOPBACK, single_machine=True,
                 hosts={"prefill": host, "decode": host, "proxy": host}, connector=connector,
                 link=LOOPBACK, topology_from=how, placement=LOCAL, same_machine=True)


def one_instance(url: str, how: str) -> Where:
    """One engine, no split (a baseline kvlab started itself)."""
    host = url_host(url)
    return Where(topology=ONE_INSTANCE, single_machine=True, hosts={"instance": host},
                 connector="none", link=LOOPBACK if is_loopback(host) else UNKNOWN,
                 topology_from=how, placement=LOCAL)


def unknown(url: str, connector: str = UNKNOWN, how: str = "") -> Where:
    """Only the URL is known: which machines served behind it is not."""
    return Where(topology=UNKNOWN, single_machine=None,
                 hosts={"url": url_host(url), "prefill": UNKNOWN, "decode": UNKNOWN},
                 connector=connector, link=UNKNOWN,
                 topology_from=how or "the URL alone: the machines behind it were not recorded",
                 placement=MANUAL)


def local_names() -> set[str]:
    """This machine's host name and interface addresses, lower-cased."""
    import socket

    import psutil

    names = {socket.gethostname().lower(), socket.gethostname().split(".")[0].lower()}
    for addrs in psutil.net_if_addrs().values():
        names |= {a.address.split("%")[0].lower() for a in addrs
                  if a.family in (socket.AF_INET, socket.AF_INET6)}
    return names


def _machine(host: str, proxy: str, local: set[str]) -> str:
    """A host's machine: a loopback name is the proxy's own machine; this machine's own names
    and addresses are one machine; any other name is itself."""
    if is_loopback(host):
        host = proxy
    return "this machine" if is_loopback(host) or host.lower() in local else host.lower()


def derive(url: str, known: Known) -> Where:
    """What a manual run can honestly say about the split behind `url`."""
    host = url_host(url)
    parts = urlsplit(url)
    if known.legs.get("prefill") and known.legs.get("decode"):
        prefill = ",".join(sorted({url_host(u) for u in known.legs["prefill"]}))
        decode = ",".join(sorted({url_host(u) for u in known.legs["decode"]}))
        how = "the proxy's /health (its legs)"
    elif known.proxy_port is not None and parts.port == known.proxy_port:
        # run-proxy.sh: an empty PREFILL_HOST/DECODE_HOST is 127.0.0.1 on the proxy's machine
        prefill = known.prefill_host or "127.0.0.1"
        decode = known.decode_host or "127.0.0.1"
        how = "the URL's port is PROXY_PORT; PREFILL_HOST and DECODE_HOST settings"
    else:
        # nothing says a split runs behind it, so CONNECTOR is not its connector
        return unknown(url, how="the URL alone: it is not PROXY_PORT and did not name "
                                "prefill and decode legs at /health")
    local = local_names()
    legs = {_machine(h, host, local) for h in (*prefill.split(","), *decode.split(","))}
    together = len(legs) == 1  # the KV stays on one machine
    link = LOOPBACK if together else (known.cluster_iface or UNKNOWN)
    return Where(topology=LOOPBACK if together else TWO_MACHINES,
                 single_machine=legs == {_machine(host, host, local)},
                 hosts={"prefill": prefill, "decode": decode, "proxy": host},
                 connector=known.connector, link=link, topology_from=how, placement=MANUAL,
                 same_machine=together)


def same_machine(a: NodeInfo | None, b: NodeInfo | None) -> bool | None:
    """Whether two processes' machines are one: by machine id where both have one, else by
    address, since two Ray nodes at one non-loopback address are one host (a container often
    has no /etc/machine-id: the H200 machines have none). None: not known."""
    if a is None or b is None:
        return None
    if a.machine_id and b.machine_id:
        return a.machine_id == b.machine_id
    if a.address and a.address == b.address and not is_loopback(a.address):
        return True
    return None


def _gpus(nodes: dict[str, NodeInfo]) -> str:
    """", GPU 0 and GPU 1" where the two nodes hold different GPUs of one host."""
    p, d = nodes["prefill"].gpus, nodes["decode"].gpus
    return f", GPU {p} and GPU {d}" if p and d and p != d else ""


def ray_split(connector: str, nodes: dict[str, NodeInfo], how: str) -> Where:
    """Prefill and decode on Ray nodes (`nodes` by role: prefill, decode, proxy), placed by
    kvlab: one machine or two by machine id, the link the prefill node's interface."""
    prefill, decode = nodes["prefill"], nodes["decode"]
    same = same_machine(prefill, decode)
    everything = None if same is None else bool(same and same_machine(prefill, nodes.get("proxy")))
    topo = LOOPBACK if same else TWO_MACHINES if same is False else UNKNOWN
    words = RAY_ONE_MACHINE + _gpus(nodes) if same else RAY_TWO_MACHINES if same is False \
        else "two Ray nodes, machines unknown (no machine id, different addresses)"
    # one machine's two nodes at two addresses (network namespaces joined by a veth pair)
    # still talk over a link: its interface, not loopback
    apart = prefill.address != decode.address
    link = LOOPBACK if same and not apart else (prefill.iface or UNKNOWN)
    return Where(topology=topo, single_machine=everything, hosts=_hosts(nodes),
                 connector=connector, link=link, topology_from=f"{how}: {words}", placement=RAY,
                 nodes=nodes, same_machine=same,
                 link_speed_mbps=None if same else prefill.link_speed_mbps)


def ray_instance(nodes: dict[str, NodeInfo], how: str) -> Where:
    """One engine on a Ray node (`nodes`: instance, and client: where the load came from)."""
    instance = nodes["instance"]
    together = same_machine(instance, nodes.get("client"))
    link = LOOPBACK if together else (instance.iface or UNKNOWN)
    return Where(topology=ONE_INSTANCE, single_machine=together, hosts=_hosts(nodes),
                 connector="none", link=link, topology_from=how, placement=RAY, nodes=nodes,
                 link_speed_mbps=None if together else instance.link_speed_mbps)


def _hosts(nodes: dict[str, NodeInfo]) -> dict[str, str]:
    return {role: n.address or n.hostname or UNKNOWN for role, n in nodes.items()}


def proxy_legs(base_url: str, api_key: str = "", timeout_s: float = 3.0) -> dict[str, list[str]]:
    """The legs kvlab's proxy names at /health (`{"legs": {"prefill URL": state}}`); empty
    for any other server or none at all."""
    parts = urlsplit(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = httpx.get(f"{parts.scheme}://{parts.netloc}/health", timeout=timeout_s,
                           headers=headers, trust_env=False)
        doc = answer.json()
    except (httpx.HTTPError, ValueError):
        return {}
    legs = doc.get("legs") if isinstance(doc, dict) else None
    out: dict[str, list[str]] = {}
    for key in legs if isinstance(legs, dict) else {}:
        role, _, url = str(key).partition(" ")
        if role in ("prefill", "decode") and url:
            out.setdefault(role, []).append(url)
    return out
