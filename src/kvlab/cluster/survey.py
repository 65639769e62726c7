"""What a dry run on a Ray cluster can know without starting anything: the nodes Ray lists and
the one node each name of the placement resolves to.

`survey(placement)` joins the cluster as a run does (`session.join`: never starting one),
reads `ray.nodes()`, resolves every name the placement uses (`nodes.resolve`: no match, or
several, refused naming the host and listing the nodes, as the run would be refused) and
leaves. It starts no agent and no engine, so what only an agent on the node can check (that
the node holds the address, that the engine and model paths exist there, that the KV store is
one directory for both nodes) is left to the run, and the dry run says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray

from kvlab.cluster import nodes
from kvlab.cluster.placement import PlacedRole, Placement
from kvlab.cluster.session import join


@dataclass(frozen=True)
class Survey:
    """The cluster's nodes as a dry run read them, and each placed name's node."""

    placement: Placement
    listed: tuple[nodes.Node, ...]
    resolved: dict[tuple[str, str], nodes.Resolved]

    def where(self, role: str) -> nodes.Resolved | None:
        """The node `role` would run on; None: where kvlab runs."""
        target = self.placement.target(role)
        return self.resolved[target] if target is not None else None

    def role(self, role: str, url: str) -> PlacedRole:
        """Where `role` would run, as a dry run says it."""
        found = self.where(role)
        if found is None:
            return PlacedRole(role=role, node="where kvlab runs", url=url)
        return PlacedRole(role=role, node=f"{found.node.name} at {found.bind}", url=url,
                          named_by=f"{found.setting}={found.name}: {found.matched_by}")

    def listing(self) -> str:
        return nodes.listing(list(self.listed))


def survey(placement: Placement) -> Survey:
    """The placement's names resolved against the live cluster; nothing started."""
    joined = join(placement)
    try:
        listed = nodes.from_ray(ray.nodes())  # type: ignore[no-untyped-call]
    finally:
        if joined:
            ray.shutdown()
    resolved = {(setting, name): nodes.resolve(setting, name, listed, placement.cluster)
                for setting, name in placement.targets()}
    return Survey(placement, tuple(listed), resolved)
