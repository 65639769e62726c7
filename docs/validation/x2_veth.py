"""A shaped link between two network namespaces of one host (docs/validation/h200-x2-ray.sh veth).

The root namespace and `kvb` are joined by a veth pair whose two ends are both named kv0
(10.77.0.1 and 10.77.0.2, /24), so that one CLUSTER_IFACE (UCX_NET_DEVICES) names the link on
either side. Each end's egress goes through a token bucket (tbf) at the given rate, so the
link is the bottleneck and kv0's counters are the transfer. Root only; pyroute2, since the H200
machines have no `ip` or `tc`.

    x2_veth.py up --gbit 10      make (or remake) the namespace, the pair and the shaping
    x2_veth.py down              remove them
    x2_veth.py exec -- CMD...    run CMD inside `kvb`
    x2_veth.py show              the pair's addresses, qdiscs and counters, as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pyroute2 import IPRoute, NetNS, netns

NS, IFACE, PEER = "kvb", "kv0", "kv0peer"
HERE, THERE, PREFIX = "10.77.0.1", "10.77.0.2", 24
LATENCY = "20ms"  # the most a packet may wait in the bucket's queue


def _burst(gbit: float) -> int:
    """A bucket that holds 1 ms at the rate (at least 64 KiB): a Linux HZ tick's worth."""
    return max(65_536, int(gbit * 1e9 / 8 / 1000))


def _shape(ipr: Any, index: int, gbit: float) -> None:
    ipr.tc("add", "tbf", index=index, handle="1:", rate=f"{gbit:g}gbit",
           burst=_burst(gbit), latency=LATENCY)


def up(gbit: float) -> None:
    down()
    netns.create(NS)
    with IPRoute() as ip:
        ip.link("add", ifname=IFACE, kind="veth", peer=PEER)
        ip.link("set", index=ip.link_lookup(ifname=PEER)[0], net_ns_fd=NS)
        index = ip.link_lookup(ifname=IFACE)[0]
        ip.addr("add", index=index, address=HERE, prefixlen=PREFIX)
        ip.link("set", index=index, state="up")
        _shape(ip, index, gbit)
    with NetNS(NS) as ns:
        index = ns.link_lookup(ifname=PEER)[0]
        ns.link("set", index=index, ifname=IFACE)
        ns.addr("add", index=index, address=THERE, prefixlen=PREFIX)
        ns.link("set", index=index, state="up")
        ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        _shape(ns, index, gbit)
    print(json.dumps(show()))


def down() -> None:
    with IPRoute() as ip:
        found = ip.link_lookup(ifname=IFACE)
        if found:
            ip.link("del", index=found[0])  # its peer goes with it
    if NS in netns.listnetns():
        netns.remove(NS)


def _side(ipr: Any) -> dict[str, Any]:
    found = ipr.link_lookup(ifname=IFACE)
    if not found:
        return {}
    link = ipr.get_links(found[0])[0]
    stats = link.get_attr("IFLA_STATS64")
    qdiscs = [q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(found[0])]
    addrs = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=found[0])]
    return {"addresses": addrs, "qdiscs": qdiscs,
            "rx_bytes": stats["rx_bytes"] if stats else None,
            "tx_bytes": stats["tx_bytes"] if stats else None}


def show() -> dict[str, Any]:
    with IPRoute() as ip:
        here = _side(ip)
    there: dict[str, Any] = {}
    if NS in netns.listnetns():
        with NetNS(NS) as ns:
            there = _side(ns)
    return {"root": here, NS: there}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("up").add_argument("--gbit", type=float, default=10.0)
    verbs.add_parser("down")
    verbs.add_parser("show")
    verbs.add_parser("exec").add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.verb == "up":
        up(args.gbit)
    elif args.verb == "down":
        down()
    elif args.verb == "show":
        print(json.dumps(show()))
    else:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        netns.setns(NS)
        os.execvp(command[0], command)  # noqa: S606 (the command is the caller's own argv)
    sys.exit(0)


if __name__ == "__main__":
    main()
