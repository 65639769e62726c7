"""Which P/D table row a split run's load rows belong in, by what they recorded.

A split run is a P/D-lab label named `disagg` or `disagg-...` (the seed's names), or any
label whose rows recorded a split topology. Its rows are grouped by (label, connector,
topology) as recorded on the row, else on the label's `link` line; what neither recorded is
"unknown". The report puts a group in a fixed row only when both match (two machines and
`shared`, two machines and `nixl`, loopback with any connector) and every other group in a row
of its own that names what was recorded, so a row with no topology never lands in "Two
machines" and a mooncake run never in the shared-connector row.

A run kvlab placed on Ray nodes (`placement: ray`) is placed the same way, by the topology its
machine ids gave: two Ray nodes on one machine recorded "loopback" and land in the one-machine
row, and the evidence says "two Ray nodes on one machine", naming the nodes, never "two
machines".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvlab.records import (
    BASELINE,
    INTERFERENCE,
    LOOPBACK,
    ONE_INSTANCE,
    RAY,
    RAY_ONE_MACHINE,
    RAY_TWO_MACHINES,
    SPLIT,
    TWO_MACHINES,
    TWO_MACHINES_NIXL,
    UNKNOWN,
    ComparisonRecord,
    LinkRecord,
    LoadRecord,
    NodeInfo,
    Notebook,
    comparison_label,
)

NOT_SPLIT = (BASELINE.label, f"{INTERFERENCE.label}-")
SEED_LABELS = (SPLIT.label, TWO_MACHINES_NIXL.label)  # the labels the P/D lab's tasks use
R = TypeVar("R", LinkRecord, ComparisonRecord)


@dataclass
class Group:
    """One split run's rows: the newest per concurrency level, with what they recorded."""

    label: str
    connector: str
    topology: str
    rows: list[LoadRecord]
    link: LinkRecord | None
    comparison: ComparisonRecord | None

    @property
    def newest(self) -> str:
        return max(r.recorded_at for r in self.rows)

    def where(self) -> str:
        """The recorded topology in words, for the evidence cell."""
        r = self.rows[-1]
        hosts = r.hosts or (self.link.hosts if self.link else None) or {}
        order = ["prefill", "decode", "proxy", *sorted(hosts)]  # the notebook sorts keys
        named = ", ".join(f"{role} {hosts[role]}" for role in dict.fromkeys(order)
                          if role in hosts)
        how = r.topology_from or (self.link.topology_from if self.link else None)
        text = {LOOPBACK: "one machine", TWO_MACHINES: "two machines",
                ONE_INSTANCE: "one instance, no split"}.get(self.topology,
                                                            "topology unknown (not recorded)")
        if (r.placement or (self.link.placement if self.link else None)) == RAY:
            text, named = self._on_ray(text, r.nodes or (self.link.nodes if self.link else None))
        link = r.link or (self.link.link if self.link else None) or UNKNOWN
        carried = r.transport or (self.link.transport if self.link else None)
        return (f"topology: {text}" + (f" ({named})" if named else "")
                + f"; connector {self.connector}; link {link}"
                + (f"; transport {carried}" if carried else "")
                + (f"; known from {how}" if how else ""))

    def _on_ray(self, text: str, nodes: dict[str, NodeInfo] | None) -> tuple[str, str]:
        """The topology in words and the nodes by role, for a run placed on Ray nodes."""
        words = {LOOPBACK: RAY_ONE_MACHINE, TWO_MACHINES: RAY_TWO_MACHINES}.get(self.topology)
        nodes = nodes or {}
        order = dict.fromkeys(["prefill", "decode", "proxy", *sorted(nodes)])  # notebook sorts
        shown = ", ".join(f"{role} node {node.node} ({node.address})"
                          for role in order if (node := nodes.get(role)) is not None
                          and node.node_id)
        return (f"{text}, {words}" if words else f"{text}, on Ray nodes"), shown


def _recorded(row: str | None, link: str | None) -> str:
    """What the row recorded, else its label's link line, else "unknown"."""
    value = row if row is not None else link
    return value if value is not None else UNKNOWN


def _is_split(label: str, rows: list[LoadRecord]) -> bool:
    if label.startswith(NOT_SPLIT):
        return False
    named = label == SPLIT.label or label.startswith(f"{SPLIT.label}-")
    return named or any(r.topology in (LOOPBACK, TWO_MACHINES) for r in rows)


def _pick(records: Sequence[R], topology: str, alone: bool) -> R | None:
    """The newest record stating this topology; one stating none only if the label has a
    single group (otherwise it could belong to any of them)."""
    for record in reversed(records):
        stated = record.topology
        if stated == topology or (stated is None and alone):
            return record
    return None


def split_groups(book: Notebook) -> list[Group]:
    """Every split run's groups, oldest first."""
    by_label: dict[str, list[LoadRecord]] = {}
    for r in book.of(LoadRecord):
        if r.capacity_probe is None:  # a search's probe: no run (a failed level is a run)
            by_label.setdefault(r.label, []).append(r)
    groups: list[Group] = []
    for label, rows in by_label.items():
        if not _is_split(label, rows):
            continue
        links = book.of(LinkRecord, label)
        newest_link = links[-1] if links else None
        keyed: dict[tuple[str, str], dict[int, LoadRecord]] = {}
        for r in rows:
            key = (_recorded(r.connector, newest_link.connector if newest_link else None),
                   _recorded(r.topology, newest_link.topology if newest_link else None))
            keyed.setdefault(key, {})[r.concurrency] = r
        alone = len(keyed) == 1
        comparisons = book.of(ComparisonRecord, comparison_label(label, BASELINE.label))
        for (connector, topology), levels in keyed.items():
            groups.append(Group(label, connector, topology, [levels[c] for c in sorted(levels)],
                                _pick(links, topology, alone),
                                _pick(comparisons, topology, alone)))
    return sorted(groups, key=lambda g: g.newest)


def take(groups: list[Group], topology: str, connector: str | None) -> Group | None:
    """Remove and return the group with this topology (and connector, if given): the seed's
    label first, then the newest."""
    found = sorted((g for g in groups if g.topology == topology
                    and (connector is None or g.connector == connector)),
                   key=lambda g: (g.label in SEED_LABELS, g.newest))
    if not found:
        return None
    groups.remove(found[-1])
    return found[-1]
