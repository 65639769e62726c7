"""A concurrency sweep: one level per concurrency, one notebook row and one per-request file each.

Before the first level the prompts are sized (`sizing`: the engine's own tokenizer through
its /tokenize when `size_prompts`, else the word estimate). For each level: a warm-up (one
request per concurrent slot by default, `warmup`), then the engine's /metrics, the measured
requests, /metrics again; the records are decoded, every request (warm-up marked) is written to
`<notebook folder>/kvlab-requests/<label>-c<N>[-r<R>]-<suffix>.jsonl`, and the row, in the shape
the seed's compare-disagg.py reads (label, concurrency, requests, model, prompt_set,
max_tokens, `ttft_s`/`tpot_s` percentiles, `output_tokens_per_s`), adds kvlab's: counts,
ITL, E2E (every distribution with p50/p90/p95/p99/mean/std and its n), request throughput,
goodput, scheduling lag, server token counts, the engine's counter deltas over the measured
requests only, the file's name and sha256, the warm-up, and how the prompts were sized. Each
row is handed to `on_row` as soon as its level ends, so an interrupted sweep keeps every level
it measured.

How many requests: `requests` (the seed's REQUESTS) or `min_requests` when given, else
enough that a p99 is not one request: max(10 x concurrency, 200). With `duration_s` a level
also runs until that many seconds have passed (whichever comes later; open loop: the arrivals
within the duration). Warm-up prompts come from their own index range, as do each level's and
each repeat's: the warm-up warms the server and the shared preamble, never a measured prompt.

The API key is used for the requests, the scrape and /tokenize, and appears in no row.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from kvlab.core.errors import InputError
from kvlab.loadgen import perrequest, stats, topology
from kvlab.loadgen.client import Target
from kvlab.loadgen.record import decode_events
from kvlab.loadgen.runner import LevelResult, LevelRun, Progress, Schedule, Until
from kvlab.loadgen.sizing import prompt_sizing
from kvlab.measure import workloads
from kvlab.observe import metrics
from kvlab.records import notebook
from kvlab.records import requests as request_files
from kvlab.records.models import LoadRecord

ProgressHook = Callable[[int, int], Progress | None]  # (concurrency, requests) -> per-record
Row = LoadRecord

MIN_REQUESTS = 200  # a level's default: p99 of at least 200 values is not one request
PER_CONCURRENCY = 10  # ... and at least 10 per concurrent slot
BLOCK = 1_000_000  # prompt indices per (repeat, level): disjoint prompts everywhere
WARMUP_OFFSET = BLOCK // 2  # a level's warm-up prompts, within its block
MAX_TIMED = 10_000  # requests prebuilt at most for a timed level (more are built as it runs)
TIMED_MARGIN = 2.0  # prebuild this many times the requests a timed level should need
GUESSED_E2E_S = 0.05  # a request's time when no warm-up measured it (timed levels only)


def default_requests(concurrency: int) -> int:
    """Requests per level when none are set: max(10 x concurrency, 200)."""
    return max(PER_CONCURRENCY * concurrency, MIN_REQUESTS)


@dataclass(frozen=True)
class LoadSpec:
    """Everything one sweep needs, except the API key (passed apart, never stored)."""

    base_url: str
    model: str
    levels: tuple[int, ...]
    requests: int | None  # None: min_requests, else the default (`default_requests`)
    max_tokens: int
    prompt_set: str
    label: str
    engine: str = "vllm"  # as records spell it (engines.base.NAMES): whose /tokenize sizes
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
    min_requests: int | None = None  # at least this many measured requests per level
    duration_s: float | None = None  # and at least this long
    warmup: int | None = None  # requests first, left out of the statistics; None: concurrency
    repeat: int | None = None  # which repeat of a run this sweep is (0-based)
    labbook: str = ""  # per-request files go beside this notebook ("" = none written)
    size_prompts: bool = False  # size prompts with the server's tokenizer (else the estimate)
    tokenize_url: str = ""  # whose /tokenize; "" = the base URL's server, then metrics_url's
    sizing: workloads.Sizing | None = None  # a sizing already made (the caller's plan's)

    def __post_init__(self) -> None:
        for name in ("requests", "min_requests", "warmup"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "warmup" else 1):
                raise InputError(f"--{name.replace('_', '-')} {value}: must be at least "
                                 f"{0 if name == 'warmup' else 1}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise InputError(f"--duration {self.duration_s}: must be above 0 seconds")
        if self.levels and max(self.floor(c) for c in self.levels) > WARMUP_OFFSET:
            raise InputError(f"--requests/--min-requests: at most {WARMUP_OFFSET} per level")
        if (self.warmup or 0) > WARMUP_OFFSET:
            raise InputError(f"--warmup {self.warmup}: at most {WARMUP_OFFSET} per level")

    def floor(self, concurrency: int) -> int:
        """The level's measured requests (a timed level's least)."""
        given = [n for n in (self.requests, self.min_requests) if n is not None]
        return max(given) if given else default_requests(concurrency)

    def warmup_for(self, concurrency: int) -> int:
        """Warm-up requests: one per concurrent slot unless set, so every connection and the
        engine's batch of `concurrency` sequences (and the shared preamble) were exercised."""
        return concurrency if self.warmup is None else self.warmup

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


def level_prompts(spec: LoadSpec, level_index: int, count: int, *, warmup: bool = False,
                  sizing: workloads.Sizing = workloads.ESTIMATE,
                  offset: int = 0) -> list[workloads.Prompt]:
    """A level's prompts (or its warm-up's) from their own index range, from `offset` on."""
    block = (spec.repeat or 0) * max(1, len(spec.levels)) + level_index
    conversations = math.ceil(spec.floor(spec.levels[level_index]) / workloads.DEFAULT_TURNS)
    return workloads.build(spec.prompt_set, count, seed=spec.seed,
                           preamble_tokens=spec.preamble_tokens,
                           start=block * BLOCK + (WARMUP_OFFSET if warmup else 0),
                           sizing=sizing, conversations=max(1, conversations), offset=offset)


def payloads_of(spec: LoadSpec, target: Target, prompts: list[workloads.Prompt],
                api_key: str = "") -> list[tuple[int, bytes]]:
    """(prompt index, request bytes), built before any clock starts."""
    return [(p.index, target.request_bytes(spec.path, spec.body(p), api_key)) for p in prompts]


def level_payloads(spec: LoadSpec, target: Target, level_index: int,
                   api_key: str = "") -> list[tuple[int, bytes]]:
    """The measured requests of a level at its (least) count, with the estimated sizing."""
    count = spec.floor(spec.levels[level_index])
    return payloads_of(spec, target, level_prompts(spec, level_index, count), api_key)


def make_row(spec: LoadSpec, concurrency: int, result: LevelResult,
             deltas: dict[str, Any], more: dict[str, Any] | None = None) -> LoadRecord:
    """One level's notebook row (seed shape + kvlab's additions; `more` from `run_level`)."""
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
        "min_requests": spec.floor(concurrency), "repeat": spec.repeat,
        **topology.unknown(spec.base_url).fields(),  # a caller that knows more says so in extra
        **(more or {}),
        **spec.extra,
    }
    if spec.duration_s is not None:
        fields["duration_s_requested"] = spec.duration_s
        fields["duration_reached"] = not result.exhausted
        fields["requests_built_during_level"] = result.built_during
    if result.interrupted:
        fields["interrupted"] = True
    return LoadRecord(label=spec.label, lab=spec.lab, **fields)


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


async def _scrape(client: httpx.AsyncClient | None, url: str) -> metrics.Snapshot | None:
    return await metrics.scrape(client, url) if client is not None else None


@dataclass
class _Level:
    """One level's two phases and the prompts they sent."""

    spec: LoadSpec
    target: Target
    concurrency: int
    index: int
    sizing: workloads.Sizing
    api_key: str
    prompts: dict[int, workloads.Prompt] = field(default_factory=dict)

    def payloads(self, count: int, warmup: bool, offset: int = 0) -> list[tuple[int, bytes]]:
        prompts = level_prompts(self.spec, self.index, count, warmup=warmup, sizing=self.sizing,
                                offset=offset)
        self.prompts.update((p.index, p) for p in prompts)
        return payloads_of(self.spec, self.target, prompts, self.api_key)

    def one_more(self, position: int) -> tuple[int, bytes]:
        """A timed level's request `position`, built while the level runs."""
        return self.payloads(1, False, position)[0]

    async def warm_up(self, stop: asyncio.Event | None) -> LevelResult | None:
        count = self.spec.warmup_for(self.concurrency)
        if count == 0:
            return None
        result = await LevelRun(self.target, self.payloads(count, True),
                                Schedule(concurrency=self.concurrency),
                                timeout_s=self.spec.timeout_s).run(stop)
        for record in result.records:
            decode_events(record)
        return result

    def measured_count(self, warm: LevelResult | None) -> tuple[int, Until | None]:
        """How many requests to prebuild, and a timed closed-loop level's rule."""
        spec, floor = self.spec, self.spec.floor(self.concurrency)
        if spec.duration_s is None:
            return floor, None
        if spec.rate is not None:
            return max(floor, self.schedule().within(spec.duration_s, MAX_TIMED)), None
        # the warm-up's fastest request (its first ones are cold), else a guess; any shortfall
        # is built while the level runs
        e2es = [stats.e2e_s(r) for r in (warm.records if warm else []) if r.ok]
        per_request = max(min(e2es), 1e-3) if e2es else GUESSED_E2E_S
        wanted = math.ceil(TIMED_MARGIN * self.concurrency * spec.duration_s / per_request)
        return max(floor, min(MAX_TIMED, wanted + self.concurrency)), \
            Until(floor, spec.duration_s, more=self.one_more, limit=WARMUP_OFFSET)

    def schedule(self) -> Schedule:
        return Schedule(concurrency=self.concurrency, rate=self.spec.rate,
                        poisson=self.spec.poisson, seed=self.spec.seed + self.index)

    def row_fields(self, warm: LevelResult | None, result: LevelResult) -> dict[str, Any]:
        """The per-request file (written when the spec names a notebook), warm-up, sizing."""
        spec = self.spec
        out: dict[str, Any] = {
            "warmup_requests": len(warm.records) if warm else 0,
            "prompt_sizing": self.sizing.as_dict(spec.seed, spec.preamble_tokens)}
        for key, n in (("warmup_failed", sum(r.failed for r in warm.records) if warm else 0),
                       ("warmup_cancelled", sum(r.cancelled for r in warm.records)
                        if warm else 0)):
            if n:
                out[key] = n
        if spec.labbook:
            lines = perrequest.level_lines(warm, result, self.prompts, level=self.concurrency,
                                           repeat=spec.repeat)
            out["requests_file"], out["requests_sha256"] = request_files.write_beside(
                Path(spec.labbook), spec.label, self.concurrency, spec.repeat, lines)
        return out


async def run_level(spec: LoadSpec, target: Target, concurrency: int, level_index: int, *,
                    api_key: str = "", stop: asyncio.Event | None = None,
                    progress: Progress | None = None,
                    client: httpx.AsyncClient | None = None,
                    sizing: workloads.Sizing | None = None) -> Row:
    """Run one level (warm-up, then the measured requests) and return its row."""
    level = _Level(spec, target, concurrency, level_index,
                   sizing or spec.sizing or workloads.ESTIMATE, api_key)
    warm = await level.warm_up(stop)
    url = spec.metrics_url or metrics.metrics_url(spec.base_url)
    before = after = None
    if warm is not None and warm.interrupted:  # stopped during the warm-up: nothing measured
        now = time.perf_counter_ns()
        result = LevelResult(records=[], start_ns=now, end_ns=now, interrupted=True,
                             unsent=spec.floor(concurrency))
    else:
        count, until = level.measured_count(warm)
        payloads = level.payloads(count, False)
        before = await _scrape(client, url)
        result = await LevelRun(target, payloads, level.schedule(), timeout_s=spec.timeout_s,
                                progress=progress, until=until).run(stop)
        for record in result.records:
            decode_events(record)
        after = await _scrape(client, url)
    return make_row(spec, concurrency, result, metrics.evidence_deltas(before, after),
                    level.row_fields(warm, result))


def tokenize_urls(spec: LoadSpec) -> list[str]:
    """Where the prompts' tokens are counted, in order of preference."""
    return [spec.tokenize_url or spec.base_url, spec.metrics_url]


async def sweep_sizing(spec: LoadSpec, api_key: str = "") -> workloads.Sizing:
    """The spec's sizing, counted by the server's tokenizer when it asks for that."""
    if spec.sizing is not None:
        return spec.sizing
    if not spec.size_prompts:
        return workloads.ESTIMATE
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=30.0, trust_env=False, headers=headers) as client:
        return await prompt_sizing(spec.engine, tokenize_urls(spec), spec.seed,
                                   spec.preamble_tokens, client)


async def run_sweep(spec: LoadSpec, *, api_key: str = "", stop: asyncio.Event | None = None,
                    progress: ProgressHook | None = None,
                    on_row: Callable[[Row], object] | None = None) -> SweepResult:
    """Every level in order; stops after the level during which `stop` was set."""
    target = Target.from_url(spec.base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    out = SweepResult(rows=[])
    sizing = await sweep_sizing(spec, api_key)
    client = httpx.AsyncClient(timeout=10.0, trust_env=False, headers=headers) \
        if spec.scrape_metrics else None
    try:
        for i, level in enumerate(spec.levels):
            hook = progress(level, spec.floor(level)) if progress is not None else None
            row = await run_level(spec, target, level, i, api_key=api_key, stop=stop,
                                  progress=hook, client=client, sizing=sizing)
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
