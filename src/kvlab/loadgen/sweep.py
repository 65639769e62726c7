"""A concurrency sweep: one level per concurrency, one notebook row per level.

For each level: build the level's prompts (seeded; questions differ between levels, the shared
preamble does not), scrape the engine's /metrics, run the level, scrape again, decode the
records, and make a row in the shape the seed's compare-disagg.py reads (label, concurrency,
requests, model, prompt_set, max_tokens, `ttft_s`/`tpot_s` with p50/p90/p99/mean,
`output_tokens_per_s`) plus kvlab's additions: ok/failed/cancelled counts, ITL, E2E, request
throughput, goodput, scheduling lag, token counts from the server's usage, and the engine's
counter deltas for the level. Each row is handed to `on_row` as soon as its level ends, so an
interrupted sweep keeps every level it measured.

The API key is used for the requests and the scrape and appears in no row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from kvlab.loadgen import stats, topology
from kvlab.loadgen.client import Target
from kvlab.loadgen.record import decode_events
from kvlab.loadgen.runner import LevelResult, LevelRun, Progress, Schedule
from kvlab.measure import workloads
from kvlab.observe import metrics
from kvlab.records import notebook
from kvlab.records.models import LoadRecord

ProgressHook = Callable[[int, int], Progress | None]  # (concurrency, requests) -> per-record
Row = LoadRecord


@dataclass(frozen=True)
class LoadSpec:
    """Everything one sweep needs, except the API key (passed apart, never stored)."""

    base_url: str
    model: str
    levels: tuple[int, ...]
    requests: int
    max_tokens: int
    prompt_set: str
    label: str
    engine: str = "vllm"  # as records spell it (engines.base.NAMES); the generator uses no engine
    endpoint: Literal["chat", "completions"] = "chat"
    timeout_s: float = 600.0
    rate: float | None = None
    poisson: bool = True
    slo: stats.Slo | None = None
    preamble_tokens: int = workloads.DEFAULT_PREAMBLE_TOKENS
    seed: int = 0
    ignore_eos: bool = False
    scrape_metrics: bool = True
    metrics_url: str = ""  # the engine's /metrics; empty = the base URL's own server
    lab: str = notebook.LAB_PD
    extra: dict[str, Any] = field(default_factory=dict)  # more fields for every row

    def body(self, prompt: workloads.Prompt) -> dict[str, Any]:
        """The request body: streamed, with the server's usage in the last chunk."""
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens,
                                "stream": True, "stream_options": {"include_usage": True}}
        if self.endpoint == "chat":
            body["messages"] = prompt.as_messages()
        else:
            body["prompt"] = prompt.as_text()
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    @property
    def path(self) -> str:
        return "/chat/completions" if self.endpoint == "chat" else "/completions"


@dataclass
class SweepResult:
    rows: list[Row]
    interrupted: bool = False


def level_payloads(spec: LoadSpec, target: Target, level_index: int,
                   api_key: str = "") -> list[tuple[int, bytes]]:
    """(prompt index, request bytes) for one level, built before any clock starts."""
    prompts = workloads.build(spec.prompt_set, spec.requests, seed=spec.seed,
                              preamble_tokens=spec.preamble_tokens,
                              start=level_index * spec.requests)
    return [(p.index, target.request_bytes(spec.path, spec.body(p), api_key)) for p in prompts]


def make_row(spec: LoadSpec, concurrency: int, result: LevelResult,
             deltas: dict[str, Any]) -> LoadRecord:
    """One level's notebook row (seed shape + kvlab's additions)."""
    sent = len(result.records)
    fields: dict[str, Any] = {
        "concurrency": concurrency, "requests": sent, "requests_planned": sent + result.unsent,
        "model": spec.model, "max_tokens": spec.max_tokens, "engine": spec.engine,
        "base_url": spec.base_url, "endpoint": spec.endpoint,
        "rate": spec.rate, "arrivals": ("poisson" if spec.poisson else "even") if spec.rate
        else "closed-loop", "timeout_s": spec.timeout_s, "ignore_eos": spec.ignore_eos,
        **workloads.describe(spec.prompt_set, spec.seed, spec.preamble_tokens),
        **stats.level_stats(result, spec.slo),
        "failures": stats.failures(result.records),
        "connections_opened": result.connections_opened,
        "metric_deltas": deltas, "prefix_hit_rate": _rounded(metrics.hit_rate(deltas)),
        "metrics_url": (spec.metrics_url or metrics.metrics_url(spec.base_url))
        if spec.scrape_metrics else None,
        **topology.unknown(spec.base_url).fields(),  # a caller that knows more says so in extra
        **spec.extra,
    }
    if result.interrupted:
        fields["interrupted"] = True
    return LoadRecord(label=spec.label, lab=spec.lab, **fields)


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


async def _scrape(client: httpx.AsyncClient | None, url: str) -> metrics.Snapshot | None:
    return await metrics.scrape(client, url) if client is not None else None


async def run_level(spec: LoadSpec, target: Target, concurrency: int, level_index: int, *,
                    api_key: str = "", stop: asyncio.Event | None = None,
                    progress: Progress | None = None,
                    client: httpx.AsyncClient | None = None) -> Row:
    """Run one level and return its row."""
    payloads = level_payloads(spec, target, level_index, api_key)
    schedule = Schedule(concurrency=concurrency, rate=spec.rate, poisson=spec.poisson,
                        seed=spec.seed + level_index)
    url = spec.metrics_url or metrics.metrics_url(spec.base_url)
    before = await _scrape(client, url)
    result = await LevelRun(target, payloads, schedule, timeout_s=spec.timeout_s,
                            progress=progress).run(stop)
    for record in result.records:
        decode_events(record)
    after = await _scrape(client, url)
    return make_row(spec, concurrency, result, metrics.evidence_deltas(before, after))


async def run_sweep(spec: LoadSpec, *, api_key: str = "", stop: asyncio.Event | None = None,
                    progress: ProgressHook | None = None,
                    on_row: Callable[[Row], object] | None = None) -> SweepResult:
    """Every level in order; stops after the level during which `stop` was set."""
    target = Target.from_url(spec.base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    out = SweepResult(rows=[])
    client = httpx.AsyncClient(timeout=10.0, trust_env=False, headers=headers) \
        if spec.scrape_metrics else None
    try:
        for i, level in enumerate(spec.levels):
            hook = progress(level, spec.requests) if progress is not None else None
            row = await run_level(spec, target, level, i, api_key=api_key, stop=stop,
                                  progress=hook, client=client)
            out.rows.append(row)
            if on_row is not None:
                on_row(row)
            if row.get("interrupted") or (stop is not None and stop.is_set()):
                out.interrupted = True
                break
    finally:
        if client is not None:
            await client.aclose()
    return out
