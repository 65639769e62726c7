"""One level of a sweep: its warm-up, its measured requests between two /metrics scrapes, its
per-request file and its row.

For each level: a warm-up (one request per concurrent slot by default, `warmup`), then the
engine's /metrics, the measured requests, /metrics again; the records are decoded, every
request (warm-up marked) is written to
`<notebook folder>/kvlab-requests/<label>-c<N>[-r<R>]-<suffix>.jsonl`, and the row, in the shape
the seed's compare-disagg.py reads (label, concurrency, requests, model, prompt_set,
max_tokens, `ttft_s`/`tpot_s` percentiles, `output_tokens_per_s`), adds kvlab's: counts,
ITL, E2E (every distribution with p50/p90/p95/p99/mean/std and its n), request throughput,
goodput, scheduling lag, server token counts, the engine's counter deltas over the measured
requests only, the file's name and sha256, the warm-up, and how the prompts were sized.

How many requests: `requests` (the seed's REQUESTS) or `min_requests` when given, else
enough that a p99 is not one request: max(10 x concurrency, 200). With `duration_s` a level
also runs until that many seconds have passed (whichever comes later; open loop: the arrivals
within the duration).

`measure_level` also returns the level's records, for a caller that judges them (`capacity`).
The API key is used for the requests and the scrape, and appears in no row. With `spec.bench`
asking, the row also carries vllm bench serve's figures and names the level's result document
(`benchresult`). Where the engine lets it be known, the cache oracle stands beside the level
(`oracle_level`).

Deliberately not here: the prompts and request bytes (`payloads`), what every level shares
(`inputs`), and the levels in order (`sweep`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from kvlab.engines import evidence_deltas, known_engine
from kvlab.loadgen import (
    benchresult,
    dataset,
    oracle_level,
    perrequest,
    returning,
    sessions,
    spread,
    stats,
    workloads,
)
from kvlab.loadgen import trace as trace_replay
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.inputs import Inputs
from kvlab.loadgen.payloads import dataset_first, level_prompts, payloads_of
from kvlab.loadgen.record import decode_events
from kvlab.loadgen.rows import make_row
from kvlab.loadgen.runner import LevelResult, LevelRun, Progress, Schedule, Until
from kvlab.loadgen.spec import BLOCK, WARMUP_OFFSET, LoadSpec
from kvlab.observe import Snapshot, metrics
from kvlab.records import DatasetEvidence, LevelOwn, LoadRecord, ReplicaCounts, RequestLine
from kvlab.records import replicas as replica_counts
from kvlab.records import requests as request_files

Row = LoadRecord

MAX_TIMED = 10_000  # requests prebuilt at most for a timed level (more are built as it runs)
TIMED_MARGIN = 2.0  # prebuild this many times the requests a timed level should need
GUESSED_E2E_S = 0.05  # a request's time when no warm-up measured it (timed levels only)


async def _scrape(client: httpx.AsyncClient | None, url: str) -> metrics.Snapshot | None:
    return await metrics.scrape(client, url) if client is not None else None


Run = Callable[[asyncio.Event | None, Progress | None], Awaitable[tuple[LevelResult, LevelOwn]]]


@dataclass
class _Level:
    """One level's two phases and the prompts they sent."""

    spec: LoadSpec
    target: Endpoint
    concurrency: int
    index: int
    inputs: Inputs
    api_key: str
    prompts: dict[int, workloads.Prompt] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)  # text prompts, by prompt index
    sent: dict[int, list[int] | str] = field(default_factory=dict)  # ids or text, as sent
    cpu_per_request: float | None = None  # the client's CPU time a request, on the warm-up
    alone_s: float | None = None  # a warm-up request's time sent alone (paced sessions)

    @property
    def base(self) -> int:
        return self.spec.block(self.index) * BLOCK

    def encode(self, prompts: list[workloads.Prompt],
               tokens: Sequence[list[int] | str] | None = None) -> list[tuple[int, bytes]]:
        self.prompts.update((p.index, p) for p in prompts)
        if tokens is not None:
            self.sent.update((p.index, t) for p, t in zip(prompts, tokens, strict=True))
        elif self.spec.endpoint == "completions":
            self.sent.update((p.index, p.as_text()) for p in prompts)
        return payloads_of(self.spec, self.target, prompts, self.api_key, tokens)

    def random_tokens(self, prompts: list[workloads.Prompt]) -> list[list[int]] | None:
        """Random prompts' token ids, from the pool (None: not random prompts)."""
        size, pool = self.spec.random_input_len, self.inputs.pool
        if size is None or pool is None:
            return None
        if self.spec.shared_prefixes is None:
            return [pool.own(self.spec.seed, self.base, p.index, self.spec.input_len(p.index))
                    for p in prompts]
        count, prefix = self.spec.shared_prefixes
        return [pool.block(self.spec.seed, self.base, p.index % count, prefix)
                + pool.own(self.spec.seed, self.base, p.index,
                           max(1, self.spec.input_len(p.index) - prefix)) for p in prompts]

    def payloads(self, count: int, warmup: bool, offset: int = 0) -> list[tuple[int, bytes]]:
        prompts = level_prompts(self.spec, self.index, count, warmup=warmup,
                                sizing=self.inputs.sizing, offset=offset)
        tokens = self.random_tokens(prompts)
        if tokens is not None and self.inputs.detokenizer is not None:
            return self.encode(prompts, [self.texts[p.index] for p in prompts])
        return self.encode(prompts, tokens)

    async def spell(self, warmup: bool, warm: LevelResult | None = None) -> None:
        """Text prompts: the random prompts of the warm-up (or, after it, of the measured
        requests) made text by the server's detokenizer, before any of them is timed."""
        detokenizer = self.inputs.detokenizer
        if detokenizer is None:
            return
        count = self.spec.warmup_for(self.concurrency) if warmup \
            else self.measured_count(warm)[0]
        prompts = level_prompts(self.spec, self.index, count, warmup=warmup)
        texts = await detokenizer.texts(self.random_tokens(prompts) or [])
        self.texts.update(zip((p.index for p in prompts), texts, strict=True))

    def warm_payloads(self, count: int) -> list[tuple[int, bytes]]:
        """Warm-up requests from their own range: session first turns of warm-up
        conversations, a trace's requests of their own tokens, or the set's prompts."""
        spec, first = self.spec, self.base + WARMUP_OFFSET
        if spec.sessions is not None and spec.dataset is None:
            return self.encode([workloads.session_turn(
                first + k, seed=spec.seed, conversation=first + k, turn=0, history=(),
                tokens=spec.preamble_tokens, sizing=self.inputs.sizing,
                distinct_opening=spec.sessions.distinct_opening) for k in range(count)])
        if self.inputs.trace is not None and self.inputs.pool is not None:
            pool = self.inputs.pool
            return self.encode([workloads.Prompt(first + k, (), max_tokens=1)
                                for k in range(count)],
                               [pool.own(spec.seed, self.base, first + k, 16)
                                for k in range(count)])
        return self.payloads(count, True)

    def one_more(self, position: int) -> tuple[int, bytes]:
        """A timed level's request `position`, built while the level runs."""
        return self.payloads(1, False, position)[0]

    async def warm_up(self, stop: asyncio.Event | None) -> LevelResult | None:
        count = self.spec.warmup_for(self.concurrency)
        if count == 0:
            return None
        await self.spell(True)
        paced = self.spec.sessions is not None and self.spec.sessions.think.kind == "paced"
        payloads = self.warm_payloads(count + 1 if paced else count)
        cpu = time.process_time()
        result = await LevelRun(self.target, payloads[:count],
                                Schedule(concurrency=self.concurrency),
                                timeout_s=self.spec.timeout_s).run(stop)
        if result.records:
            self.cpu_per_request = (time.process_time() - cpu) / len(result.records)
        for record in result.records:
            decode_events(record)
        if paced:  # a paced think time's request time (`request_time`), before the scrape
            alone = await LevelRun(self.target, payloads[count:], Schedule(concurrency=1),
                                   timeout_s=self.spec.timeout_s).run(stop)
            for record in alone.records:
                decode_events(record)
            self.alone_s = next((stats.e2e_s(r) for r in alone.records if r.ok), None)
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
        more = None if self.inputs.detokenizer is not None else self.one_more
        return max(floor, min(MAX_TIMED, wanted + self.concurrency)), \
            Until(floor, spec.duration_s, more=more, limit=WARMUP_OFFSET)

    def schedule(self) -> Schedule:
        return Schedule(concurrency=self.concurrency, rate=self.spec.rate,
                        burstiness=self.spec.burstiness, seed=self.spec.seed + self.index)

    def prepare(self, warm: LevelResult | None) -> Run:
        """Build the measured requests now (before the clock and the first scrape)."""
        if self.spec.sessions is not None:
            return lambda stop, progress: self.sessions(stop, progress, warm)
        if self.inputs.trace is not None:
            payloads, until = self.trace_payloads(), None
            schedule = Schedule(concurrency=self.concurrency, arrivals_ns=self.inputs.trace
                                .offsets_ns(self.spec.trace.speedup if self.spec.trace else 1))
        else:
            count, until = self.measured_count(warm)
            payloads, schedule = self.payloads(count, False), self.schedule()

        async def run(stop: asyncio.Event | None,
                      progress: Progress | None) -> tuple[LevelResult, LevelOwn]:
            result, processes = await self.send(payloads, schedule, until, stop, progress)
            for record in result.records:
                decode_events(record)
            own = self.trace_fields()
            own.client_processes = processes if processes > 1 else None
            own.client_cpu_per_request_s = round(self.cpu_per_request, 6) \
                if self.cpu_per_request else None
            if self.spec.dataset is not None:
                own.prompt_set, own.dataset = "dataset", self.dataset_fields(result)
            return result, own
        return run

    async def send(self, payloads: list[tuple[int, bytes]], schedule: Schedule,
                   until: Until | None, stop: asyncio.Event | None, progress: Progress | None
                   ) -> tuple[LevelResult, int]:
        """The level sent by one loop, or spread over processes where its rate needs them
        (`spread`; its progress then moves when they are done); and how many sent it."""
        rate = schedule.rate if schedule.open_loop else None
        n = self.spec.processes or spread.processes_for(rate, self.cpu_per_request)
        if n == 1 or not schedule.open_loop:
            return await LevelRun(self.target, payloads, schedule, timeout_s=self.spec.timeout_s,
                                  progress=progress, until=until, max_s=self.spec.max_s
                                  ).run(stop), 1
        result = await spread.run_spread(self.target, payloads, schedule, n,
                                         timeout_s=self.spec.timeout_s, max_s=self.spec.max_s,
                                         stop=stop)
        if progress is not None:
            for record in result.records:
                progress(record)
        return result, n

    def trace_payloads(self) -> list[tuple[int, bytes]]:
        spec, trace, pool = self.spec, self.inputs.trace, self.inputs.pool
        assert trace is not None and pool is not None and spec.trace is not None
        prompts, tokens = [], []
        for i, r in enumerate(trace.requests):
            prompts.append(workloads.Prompt(self.base + i, (), document_tokens=r.input_length,
                                            max_tokens=max(1, min(r.output_length,
                                                                  spec.max_tokens))))
            tokens.append(trace_replay.prompt_tokens(r, i, pool, spec.seed, self.base,
                                                     spec.trace.block_tokens))
        return self.encode(prompts, tokens)

    def trace_fields(self) -> LevelOwn:
        spec, trace = self.spec, self.inputs.trace
        if trace is None or spec.trace is None:
            return LevelOwn()
        return LevelOwn(prompt_set="trace", arrivals="trace",
                        trace=trace_replay.describe(spec.trace, trace, self.inputs.pool,
                                                    spec.max_tokens))

    def dataset_fields(self, result: LevelResult) -> DatasetEvidence | None:
        """What the level sent of the user's file: the records it took (a conversation's
        number or a prompt's place in the level gives the record), the output lengths."""
        spec, data = self.spec, self.spec.dataset
        if data is None:
            return None
        first = dataset_first(spec, self.index)
        turns = spec.sessions.turns if spec.sessions is not None else 1
        positions: set[int] = set()
        outputs: list[int] = []
        for record in result.records:
            conv, turn = divmod(record.prompt_index - self.base, turns)
            positions.add(first + conv)
            wanted = data.at(first + conv).turns[turn].output_tokens
            if wanted:
                outputs.append(wanted)
        return data.evidence(first, positions, outputs, spec.max_tokens)

    def session_build(self, s: sessions.SessionSpec) -> sessions.Build:
        """Each turn from the conversation so far: kvlab's generated turns, or the user's
        file's conversations (a level's conversation `conv` is record first + conv)."""
        spec, data = self.spec, self.spec.dataset
        first = dataset_first(spec, self.index) if data is not None else 0

        def build(conv: int, turn: int, history: sessions.History) -> tuple[
                workloads.Prompt, bytes] | None:
            index = self.base + conv * s.turns + turn
            if data is None:
                prompt = workloads.session_turn(
                    index, seed=spec.seed, conversation=self.base + conv, turn=turn,
                    history=history, tokens=spec.preamble_tokens, sizing=self.inputs.sizing,
                    distinct_opening=s.distinct_opening)
            elif turn < len((entry := data.at(first + conv)).turns):
                prompt = dataset.prompt(entry, index, spec.max_tokens, turn=turn,
                                        history=history, conversation=self.base + conv)
            else:
                return None
            return prompt, self.target.request_bytes(spec.path, spec.body(prompt), self.api_key)
        return build

    async def sessions(self, stop: asyncio.Event | None, progress: Progress | None,
                       warm: LevelResult | None) -> tuple[LevelResult, LevelOwn]:
        """A level of user sessions: each turn built from the conversation so far (a paced
        think time gets its mean from a warm request's time: `request_time`)."""
        spec, s = self.spec, self.spec.sessions
        assert s is not None
        if s.think.kind == "paced":
            s = replace(s, think=s.think.paced_for(self.concurrency, *self.request_time(warm)))

        if spec.dataset is not None:
            s = replace(s, conversations=spec.dataset.conversations_for(
                dataset_first(spec, self.index), spec.session_floor()))
        got = await sessions.SessionRun(
            self.target, self.concurrency, s, self.session_build(s), timeout_s=spec.timeout_s,
            seed=spec.seed + self.index, duration_s=spec.duration_s,
            min_requests=spec.session_floor(), progress=progress).run(stop)
        self.prompts.update(got.prompts)
        summary = returning.summary(got.level.records, got.prompts, s.cache_block_tokens)
        summary.peak_active_users = got.peak_active_users
        summary.conversations_started = got.conversations_started
        summary.conversations_planned = s.planned(self.concurrency, spec.session_floor())
        workload = s.workload(self.concurrency)
        return got.level, LevelOwn(prompt_set="sessions", workload=workload,
                                   arrivals=workload.arrivals, sessions=summary,
                                   dataset=self.dataset_fields(got.level))

    def request_time(self, warm: LevelResult | None) -> tuple[float, str]:
        """A request's time on the warm engine, and how it was had: the warm-up's request sent
        alone after the others (they ran all at once, so even their fastest waited on the
        rest: on two CPU cores 2.4 s against 0.3 s alone, and a paced think time 8x too long),
        else the warm-up's fastest, else a guess."""
        if self.alone_s is not None:
            return self.alone_s, "a warm-up request sent alone"
        e2es = [stats.e2e_s(r) for r in (warm.records if warm else []) if r.ok]
        return (min(e2es), "the warm-up's fastest") if e2es else \
            (GUESSED_E2E_S, "a guess: no warm-up request answered")

    def lines(self, warm: LevelResult | None, result: LevelResult) -> list[RequestLine]:
        return perrequest.level_lines(warm, result, self.prompts, level=self.concurrency,
                                      repeat=self.spec.repeat)

    async def with_oracle(self, client: httpx.AsyncClient | None, lines: list[RequestLine],
                          after: Snapshot | None, own: LevelOwn) -> None:
        """The cache oracle beside the level, where the engine lets it be known."""
        spec = self.spec
        engine = known_engine(spec.engine)
        if not spec.oracle or client is None or engine is None or not lines:
            return
        root = spec.tokenize_url or spec.base_url.removesuffix("/v1")
        found = await oracle_level.beside(
            client, engine, root.rstrip("/"), spec.model, lines, self.prompts, after,
            spec.oracle_tier_tokens, spec.oracle_curve_tokens, sent=self.sent,
            history=self.inputs.history, tier_chunk_tokens=spec.oracle_tier_chunk_tokens)
        if isinstance(found, str):
            own.oracle_absent = found
        else:
            own.oracle = found

    def row_fields(self, warm: LevelResult | None, own: LevelOwn,
                   lines: list[RequestLine]) -> LevelOwn:
        """`own` with the per-request file (written when the spec names a notebook), the
        warm-up and the sizing."""
        spec = self.spec
        own.warmup_requests = len(warm.records) if warm else 0
        # a trace's, random or a dataset's prompts have no preamble of kvlab's to size
        if not spec.token_prompts and spec.dataset is None:
            own.prompt_sizing = self.inputs.sizing.as_record(
                spec.seed, spec.preamble_tokens).model_copy(update={"fit": spec.fit})
        if warm is not None:
            own.warmup_failed = sum(r.failed for r in warm.records) or None
            own.warmup_cancelled = sum(r.cancelled for r in warm.records) or None
        if spec.labbook:
            own.requests_file, own.requests_sha256 = request_files.write_beside(
                Path(spec.labbook), spec.label, self.concurrency, spec.repeat, lines)
        return own


@dataclass
class Measured:
    """A level's row and the records it summarises (for a caller that judges them)."""

    row: Row
    result: LevelResult


async def measure_level(spec: LoadSpec, target: Endpoint, concurrency: int, level_index: int, *,
                        api_key: str = "", stop: asyncio.Event | None = None,
                        progress: Progress | None = None,
                        client: httpx.AsyncClient | None = None,
                        inputs: Inputs | None = None) -> Measured:
    """Run one level (warm-up, then the measured requests): its row and its records."""
    level = _Level(spec, target, concurrency, level_index,
                   inputs or Inputs(spec.sizing or workloads.ESTIMATE), api_key)
    warm = await level.warm_up(stop)
    urls = spec.metrics_urls or (metrics.metrics_url(spec.base_url),)
    before: list[Snapshot | None] = [None] * len(urls)
    after: list[Snapshot | None] = [None] * len(urls)
    own = LevelOwn()
    if warm is not None and warm.interrupted:  # stopped during the warm-up: nothing measured
        now = time.perf_counter_ns()
        result = LevelResult(records=[], start_ns=now, end_ns=now, interrupted=True,
                             unsent=spec.floor(concurrency))
    else:
        await level.spell(False, warm)
        run = level.prepare(warm)
        before = [await _scrape(client, url) for url in urls]
        result, own = await run(stop, progress)
        after = [await _scrape(client, url) for url in urls]
    lines = level.lines(warm, result) if spec.labbook else []
    if spec.labbook and not result.interrupted and len(urls) == 1:
        await level.with_oracle(client, lines, after[0], own)
    each = [evidence_deltas(b, a) for b, a in zip(before, after, strict=True)]
    row = make_row(spec, concurrency, result,
                   each[0] if len(each) == 1 else replica_counts.summed(each),
                   level.row_fields(warm, own, lines))
    if len(urls) > 1 and client is not None:
        _replicas(row, replica_counts.counts(urls, each))
        row.oracle_absent = (f"no oracle: {len(urls)} engines behind one front, each with a "
                             "cache of its own (`kvlab run replicas` replays each one's)")
    _bench_result(spec, concurrency, result, row)
    return Measured(row, result)


def _replicas(row: Row, found: list[ReplicaCounts]) -> None:
    """Each replica's counts and share on the row, and the one far below the others named."""
    for c, share in zip(found, replica_counts.shares(found), strict=True):
        c.share = share
    row.replicas = found
    row.replica_note = replica_counts.far_below(found)
    share = replica_counts.hit_share(found)
    row.prefix_hit_rate = round(share, 4) if share is not None else None


def _bench_result(spec: LoadSpec, concurrency: int, result: LevelResult, row: Row) -> None:
    """vllm bench's chosen figures on the row, and its result document when asked."""
    ask = spec.bench
    if ask.shown:
        row.vllm_metrics = benchresult.metrics(result.records, ask)
    if ask.save and not result.interrupted:
        facts = benchresult.LevelFacts(
            label=spec.label, model=spec.model, endpoint=spec.endpoint, rate=spec.rate,
            burstiness=spec.burstiness, concurrency=concurrency,
            planned=len(result.records) + result.unsent)
        row.result_file = str(benchresult.write(ask, facts, result))
