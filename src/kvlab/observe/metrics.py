"""Prometheus scrapes of an engine's /metrics, and the counter deltas between two of them.

Parsing is prometheus_client's. Counters are summed over every label set that matches a
filter (so over vLLM's `engine` label), `_created` series (unix timestamps) are ignored, and a
counter that went down between two scrapes is taken as an engine restart: its delta is the new
value, not a negative number. Both the old bare names (`vllm:prefix_cache_hits`) and the
`_total` names on the wire are accepted. Which metric means what is each engine adapter's table,
given to `evidence_deltas` as an `EvidenceSource` (this module finds no engine itself: which
engine a scrape is from is `engines.base.source_of`). Beside the deltas, `evidence_deltas`
states the KV cache's size in tokens where the engine's /metrics says it (`kv_cache_tokens`), so
a run against an engine kvlab did not start still knows the cache it ran against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvlab.records import Deltas

SeriesKey = tuple[str, frozenset[tuple[str, str]]]
# evidence key (as the notebook names it) -> (counter family, label filter)
CounterTable = dict[str, tuple[str, dict[str, str]]]
# evidence key -> metric names to try in order (a gauge renamed between versions)
GaugeTable = dict[str, tuple[str, ...]]


@dataclass
class Snapshot:
    """One scrape: sample name + labels -> value, and when it was taken (monotonic)."""

    series: dict[SeriesKey, float] = field(default_factory=dict)
    taken_at: float = field(default_factory=time.monotonic)
    url: str = ""

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.series}

    @property
    def namespaces(self) -> set[str]:
        """The prefixes of its metric names (`vllm` of `vllm:num_requests_running`)."""
        return {name.split(":", 1)[0] for name in self.names if ":" in name}

    def values(self, name: str,
               labels: dict[str, str] | None = None) -> dict[frozenset[tuple[str, str]], float]:
        """Every series of `name` (or `name_total`) whose labels include `labels`."""
        wanted = set((labels or {}).items())
        candidates = (name, name + "_total") if not name.endswith("_total") else (name,)
        out = {}
        for (sample, key), value in self.series.items():
            if sample in candidates and wanted <= key:
                out[key] = value
        return out

    def total(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """Sum over matching series; None when the metric is absent."""
        found = self.values(name, labels)
        return sum(found.values()) if found else None

    def label_value(self, name: str, label: str) -> str | None:
        """A label of an info-style metric (e.g. block_size of vllm:cache_config_info)."""
        for (sample, key), _ in self.series.items():
            if sample == name:
                for k, v in key:
                    if k == label:
                        return v
        return None


def parse(text: str, url: str = "") -> Snapshot:
    """A /metrics body as a Snapshot (`_created` timestamps dropped)."""
    snap = Snapshot(url=url)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            snap.series[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return snap


async def scrape(client: httpx.AsyncClient, metrics_url: str) -> Snapshot | None:
    """Scrape one /metrics URL; None when it cannot be read (the engine may not expose it)."""
    try:
        response = await client.get(metrics_url)
        if response.status_code != 200:
            return None
        return parse(response.text, metrics_url)
    except (httpx.HTTPError, ValueError):
        return None


def metrics_url(base_url: str) -> str:
    """/metrics at the server root for an OpenAI base URL (with or without /v1)."""
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return root + "/metrics"


def counter_delta(before: Snapshot, after: Snapshot, name: str,
                  labels: dict[str, str] | None = None) -> float | None:
    """Increase of a counter between two scrapes, summed over series; resets handled."""
    now = after.values(name, labels)
    if not now:
        return None
    then = before.values(name, labels)
    total = 0.0
    for key, value in now.items():
        previous = then.get(key, 0.0)
        total += value if value < previous else value - previous
    return total


def table_deltas(before: Snapshot, after: Snapshot, table: CounterTable) -> dict[str, float]:
    """Each counter of an adapter's table that increased or exists, by its evidence key."""
    out = {}
    for key, (name, labels) in table.items():
        value = counter_delta(before, after, name, labels)
        if value is not None:
            out[key] = value
    return out


class EvidenceSource(Protocol):
    """What an engine's /metrics means: the tables an engine adapter pins."""

    @property
    def metric_namespace(self) -> str: ...

    @property
    def counters(self) -> CounterTable: ...

    @property
    def gauges(self) -> GaugeTable: ...

    @property
    def transfer_counters(self) -> CounterTable: ...

    def cache_size(self, snap: Snapshot) -> int | None:
        """The KV cache's size in tokens as the scrape states it (None: not exposed)."""
        ...


def evidence_deltas(before: Snapshot | None, after: Snapshot | None,
                    engine: EvidenceSource | None) -> Deltas:
    """The engine's reuse counters' increases (seed key names), and end-of-run gauges."""
    if before is None or after is None or engine is None:
        return {}
    out: Deltas = {key: round(value, 3)
                   for key, value in table_deltas(before, after, engine.counters).items()}
    out.update({f"{key}_end": value for key, value in gauge_reading(after, engine.gauges).items()})
    size = engine.cache_size(after)
    if size is not None:  # not a delta: the cache the run ran against, as the engine states it
        out["kv_cache_tokens"] = size
    return out


def transfer_deltas(before: Snapshot | None, after: Snapshot | None,
                    engine: EvidenceSource | None) -> dict[str, float]:
    """KV moved between instances (NIXL's bytes and transfers, on vLLM's decode side)."""
    if before is None or after is None or engine is None:
        return {}
    return table_deltas(before, after, engine.transfer_counters)


def gauge_reading(snap: Snapshot, gauges: GaugeTable) -> dict[str, float]:
    """The gauges of `gauges` one scrape holds, by evidence key."""
    out = {}
    for key, names in gauges.items():
        for name in names:
            value = snap.total(name)
            if value is not None:
                out[key] = round(value, 4)
                break
    return out


def hit_rate(deltas: Deltas) -> float | None:
    """Δhits/Δqueries of the local prefix cache (tokens), or cached/prompt for llama-server."""
    hits, queries = deltas.get("prefix_cache_hits"), deltas.get("prefix_cache_queries")
    if hits is not None and queries:
        return float(hits) / float(queries)
    cached, total = deltas.get("prompt_tokens_cached_total"), deltas.get("prompt_tokens_total")
    if cached is not None and total is not None and (cached + total):
        # llama-server's prompt_tokens_total counts only processed tokens
        return float(cached) / float(cached + total)
    return None
