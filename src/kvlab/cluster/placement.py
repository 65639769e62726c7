"""Where a run's engines go: this machine (the default), or the nodes of a Ray cluster.

A `Placement` is data, read from the settings and flags before anything starts:

- no cluster (neither `--cluster ADDRESS` nor Ray's own `RAY_ADDRESS`): every engine on this
  machine, as kvlab always ran them (`LOCAL`);
- a cluster and `--node NAME`: every engine of the run on that one node (the offload lab on a
  GPU box, driven from a laptop);
- a cluster and PREFILL_HOST / DECODE_HOST: the prefill side (`prefill`, `shared-a`) on
  PREFILL_HOST's node and every other engine (decode, the baseline, as the seed's
  serve-decode.sh serves it) on DECODE_HOST's node;
- a cluster and PREFILL_HOSTS / DECODE_HOSTS (XpYd): one prefill engine per listed prefill
  node (`prefill`, `prefill-2`, ...: `records.rows.leg_role`) and one decode engine per listed
  decode node, the baseline on the first decode node.

kvlab's proxy and its load generator run where kvlab runs, unless `--proxy-node NAME` puts the
proxy on a node. Which node a name means is decided against the live cluster (`nodes.py`);
`DryPlacement` is what a dry run says of it (`survey.py` reads the nodes). This module imports
no Ray: the single-machine path reads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict

from kvlab.core import SettingError, Settings
from kvlab.engines import EnginePlan, Flag, known_engine
from kvlab.records import leg_of, leg_roles

RAY_ADDRESS = "RAY_ADDRESS"  # Ray's own variable naming the cluster to join
PREFILL_SIDE = ("prefill", "shared-a")
PROXY = "proxy"
# every plan kvlab makes (vLLM, llama-server, kvlab's proxy) names where it listens so
HOST_FLAG, PORT_FLAG = "--host", "--port"


@dataclass(frozen=True)
class Placement:
    """Where each role of a run goes; `cluster` empty = this machine."""

    cluster: str = ""
    origin: str = ""  # "--cluster" or RAY_ADDRESS
    node: str = ""  # --node: every engine on one node
    prefill_host: str = ""
    decode_host: str = ""
    proxy_node: str = ""
    prefill_hosts: tuple[str, ...] = ()  # PREFILL_HOSTS: one prefill engine on each
    decode_hosts: tuple[str, ...] = ()  # DECODE_HOSTS: one decode engine on each

    @property
    def remote(self) -> bool:
        return bool(self.cluster)

    def side(self, side: str) -> tuple[str, tuple[str, ...]]:
        """The setting naming `side`'s nodes (prefill, decode) and the names it gives."""
        many: tuple[str, ...] = getattr(self, f"{side}_hosts")
        if many:
            return f"{side.upper()}_HOSTS", many
        return f"{side.upper()}_HOST", (getattr(self, f"{side}_host"),)

    def counts(self) -> tuple[int, int]:
        """How many prefill and decode engines the split runs (one each on this machine)."""
        if not self.remote:
            return 1, 1
        return len(self.side("prefill")[1]), len(self.side("decode")[1])

    def split_roles(self) -> tuple[str, ...]:
        """The split's engine roles: every prefill, then every decode."""
        return leg_roles(*self.counts())

    def target(self, role: str) -> tuple[str, str] | None:
        """(setting, name) of the node `role` goes to; None: where kvlab runs."""
        if not self.remote:
            return None
        if role == PROXY:
            return ("--proxy-node", self.proxy_node) if self.proxy_node else None
        if self.node:
            return "--node", self.node
        side, index = leg_of(role)
        setting, names = self.side("prefill" if side in PREFILL_SIDE else "decode")
        return setting, names[index]

    def targets(self) -> list[tuple[str, str]]:
        """Every (setting, name) this placement names, once each."""
        roles = (*self.split_roles(), PROXY)
        found = [t for t in (self.target(r) for r in roles) if t is not None]
        return list(dict.fromkeys(found))

    def describe(self) -> dict[str, object]:
        if not self.remote:
            return {"placement": "local"}
        roles = {r: (t[1] if (t := self.target(r)) else "where kvlab runs")
                 for r in (*self.split_roles(), "baseline", PROXY)}
        return {"placement": "ray", "cluster": self.cluster, "from": self.origin,
                "roles": roles}


LOCAL = Placement()


class PlacedRole(BaseModel):
    """Where a dry run's role would run: its node (as the cluster named it) and URL."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: str
    node: str  # the node's name and short id, or "where kvlab runs"
    url: str  # its port is one free on the node, chosen when it starts
    named_by: str | None = None  # the setting and name that chose the node, and how it matched


class DryPlacement(BaseModel):
    """The placement a cluster run would use, read from the cluster without starting anything."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cluster: str
    origin: str  # --cluster or RAY_ADDRESS
    roles: list[PlacedRole]
    store: str | None = None  # the P/D store's path, the same on the nodes that use it
    store_seen_by: list[str] = []
    store_from: str = ""
    nodes: str  # every node the cluster lists
    left_to_the_run: str  # what only the run's agents on the nodes can check


def from_options(settings: Settings, cluster: str | None = None, node: str | None = None,
                 proxy_node: str | None = None,
                 environ: Mapping[str, str] | None = None) -> Placement:
    """The placement the flags and settings ask for; refused when a cluster run cannot say
    where its engines go, or a node is named with no cluster to find it in."""
    env = os.environ if environ is None else environ
    address = cluster or env.get(RAY_ADDRESS, "")
    origin = "--cluster" if cluster else RAY_ADDRESS
    if not address:
        if node or proxy_node:
            flag = "--node" if node else "--proxy-node"
            raise SettingError(f"{flag} names a Ray node, and no cluster is given: pass "
                               "--cluster ADDRESS or set RAY_ADDRESS (kvlab joins a running "
                               "cluster; it never starts one)")
        return LOCAL
    if not node and not (settings.hosts("prefill") and settings.hosts("decode")):
        raise SettingError(
            "a cluster run places prefill on PREFILL_HOST's node and decode on DECODE_HOST's: "
            "set both (a node's address, host name or kvlab-host label; PREFILL_HOSTS and "
            "DECODE_HOSTS list several), or pass --node NAME to place every engine on one node")
    return Placement(cluster=address, origin=origin, node=node or "",
                     prefill_host=settings.prefill_host, decode_host=settings.decode_host,
                     proxy_node=proxy_node or "",
                     prefill_hosts=_listed(settings.prefill_hosts),
                     decode_hosts=_listed(settings.decode_hosts))


def _listed(value: str) -> tuple[str, ...]:
    return tuple(value.split(",")) if value else ()


def on_node(plan: EnginePlan, address: str, port: int) -> EnginePlan:
    """`plan` as it runs on a node: listening on `address:port`, and advertising `address` to
    its peer where the engine advertises one (NIXL's side channel)."""
    engine = known_engine(plan.engine)
    if engine is not None and (names := set(engine.address_env) & set(plan.env)):
        plan = replace(plan, env={**plan.env, **dict.fromkeys(names, address)})
    return rebind(plan, address, port)


def rebind(plan: EnginePlan, host: str, port: int) -> EnginePlan:
    """`plan` listening on `host:port` (a node's address and a port free there)."""
    flags = tuple(Flag(f.name, host) if f.name == HOST_FLAG
                  else Flag(f.name, str(port)) if f.name == PORT_FLAG else f
                  for f in plan.flags)
    summary = tuple((k, f"http://{host}:{port}") if k == "listening on" else (k, v)
                    for k, v in plan.summary)
    return replace(plan, flags=flags, host=host, port=port, summary=summary)
