"""Capacity at a latency target: the highest load whose measured percentiles meet it.

The target (`LatencyTarget.parse`, `--slo`'s percentile bounds in `loadgen/slo.py`'s grammar):
`ttft_p90<=500ms,tpot_p90<=50ms`, any of ttft, tpot, itl and e2e at p50/p90/p95/p99, and
`errors<=F`, the share of requests that may fail (0.01 unless given). TTFT and E2E count
from when the request was due (its schedule, its think time's end), not from when the client
sent it, so a queue in the client counts against the target as a queue in the server would.

The load is one knob (`Knob`): an open-loop request rate (Poisson), a closed-loop concurrency,
a number of users (user sessions) or a trace's replay speed. The search (`search`) measures a
probe (one level of its own fresh prompts, `duration_s` long, a row labelled
`<label>-capacity` with its per-request file) at `start`, multiplies by `factor` while probes
meet the target (divides while they miss), then bisects between the highest load that met and
the lowest that missed until they are within `resolution` of each other (one unit for whole
numbers) or `max_steps` probes were spent. A probe meets the target when every bound's
percentile over its successes is within it and no more than `errors` failed; each percentile
also gets a 95% bootstrap interval (requests resampled, numpy, seeded), and a probe whose
interval straddles a bound is measured again (`repeats`) and judged on the pooled requests.
Capacity is the highest load that met the target below the lowest that missed; it assumes
latency grows with load, and says so when a probe contradicts that.

A search costs what its answer is worth. Levels the run already measured on the same engine
and workload (`measured`) are judged against the target by their own percentiles first: when
the lightest load there is, one request at a time (a closed-loop level of concurrency 1),
missed it, no load can meet it, and the answer "none" is given with no probe, naming that
level. Otherwise the search starts where the measured levels point (a rate search at the
requests/s of the busiest level that met it; a concurrency search at its concurrency). An
open-loop probe is bounded by its duration, not by a count: it sends the requests its rate
brings within `duration_s` (at least `MIN_OK`, at most `min_requests`), so a probe at a
quarter of a request a second takes seconds, not minutes; a `min_requests` the user gave
(`floor_given`) is kept at any rate.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from kvlab.core import InputError, Say, quiet
from kvlab.loadgen import slo, stats
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.inputs import prepare_inputs
from kvlab.loadgen.level import Measured, measure_level
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import metrics_client
from kvlab.records import (
    BoundFigure,
    CapacityMethod,
    CapacityProbe,
    CapacityRecord,
    CapacityStep,
    CapacityTarget,
    LoadRecord,
    capacity_label,
)

KnobName = Literal["rate", "concurrency", "users", "speedup"]
METRICS = slo.METRICS
QUANTILES = slo.QUANTILES
DEFAULT_ERRORS = slo.DEFAULT_ERRORS
MIN_OK = 5  # fewer successes than this: a probe cannot meet anything
RESAMPLES = 1000
SEED = 17
CAPACITY_BLOCK = 10_000  # probes' prompt blocks start here: no probe reuses a sweep's prompt


@dataclass(frozen=True)
class Bound:
    metric: str
    q: int
    limit_s: float

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.q}"


@dataclass(frozen=True)
class LatencyTarget:
    """Percentile bounds in seconds, and the share of requests that may fail."""

    bounds: tuple[Bound, ...]
    errors: float = DEFAULT_ERRORS

    @classmethod
    def parse(cls, text: str) -> LatencyTarget:
        """The percentile bounds of an `--slo` (`loadgen/slo.py`'s grammar)."""
        return cls.of(slo.parse(text), text)

    @classmethod
    def of(cls, objectives: slo.Objectives, text: str) -> LatencyTarget:
        """The percentile bounds of parsed objectives; refused when there are none."""
        bounds = tuple(Bound(t.metric, t.q, t.limit_s) for t in objectives.percentiles
                       if t.q is not None)
        if not bounds:
            raise InputError(f"--slo {text!r}: a capacity target bounds a percentile, e.g. "
                             "ttft_p90<=500ms,tpot_p90<=50ms (errors<=0.01)")
        return cls(bounds, objectives.errors)

    def text(self) -> str:
        return ",".join([*(f"{b.key}<={b.limit_s:g}" for b in self.bounds),
                         f"errors<={self.errors:g}"])


@dataclass(frozen=True)
class Knob:
    name: KnobName
    unit: str
    integer: bool
    lowest: float
    highest: float

    @classmethod
    def of(cls, name: str) -> Knob:
        knobs = {"rate": cls("rate", "requests/s", False, 0.01, 10_000.0),
                 "concurrency": cls("concurrency", "concurrent requests", True, 1, 4096),
                 "users": cls("users", "users", True, 1, 4096),
                 "speedup": cls("speedup", "x the trace's speed", False, 0.01, 10_000.0)}
        if name not in knobs:
            raise InputError(f"--capacity-knob {name!r}: choose one of {', '.join(knobs)}")
        return knobs[name]

    def clamp(self, value: float) -> float:
        value = min(max(value, self.lowest), self.highest)
        return float(max(1, round(value))) if self.integer else float(f"{value:.3g}")


@dataclass(frozen=True)
class SearchPlan:
    start: float = 1.0
    factor: float = 2.0
    max_load: float | None = None  # None: the knob's own limit
    max_steps: int = 8
    resolution: float = 0.1  # bracket width, as a share of the load that met
    duration_s: float = 15.0  # per probe
    min_requests: int = 20
    floor_given: bool = False  # --min-requests given: every probe sends that many, at any rate
    warmup: int = 2
    repeats: int = 1  # probes measured at most this many times when the interval straddles
    in_flight_cap: int = 256  # open-loop knobs: the client's cap, high enough not to bind

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise InputError(f"--capacity-factor {self.factor}: must be above 1")
        if self.max_steps < 1 or self.repeats < 1:
            raise InputError("--capacity-steps and repeats: give at least 1")
        if not self.start > 0 or not self.duration_s > 0:
            raise InputError("--capacity-start and --duration: must be above 0")


# --- judging one probe ------------------------------------------------------------------

def _due(r: RequestRecord) -> float:
    return max(0.0, stats.lag_s(r) or 0.0)


def values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    """A metric over the successes; TTFT and E2E from when each request was due."""
    ok = [r for r in records if r.ok]
    if metric == "ttft":
        return [stats.ttft_s(r) + _due(r) for r in ok]
    if metric == "e2e":
        return [stats.e2e_s(r) + _due(r) for r in ok]
    if metric == "itl":
        return [v for r in ok for v in stats.itl_s(r)]
    return [v for v in (stats.tpot_s(r) for r in ok) if v is not None]


def interval(sample: Sequence[float], q: int, seed: int = SEED) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of the q-th percentile (None: too few values)."""
    if len(sample) < MIN_OK:
        return None
    data = np.asarray(sample, dtype=np.float64)
    draws = max(200, min(RESAMPLES, 5_000_000 // len(data)))
    rng = np.random.default_rng(seed)
    picked = data[rng.integers(0, len(data), size=(draws, len(data)))]
    found = np.percentile(picked, q, axis=1)
    low, high = np.quantile(found, [0.025, 0.975])
    return float(low), float(high)


@dataclass
class Probe:
    load: float
    records: list[RequestRecord]
    rows: list[LoadRecord]
    figures: dict[str, BoundFigure] = field(default_factory=dict)
    failed_share: float = 0.0
    passed: bool = False
    why: str = ""

    @property
    def straddles(self) -> bool:
        return any(f.low is not None and f.high is not None and f.low <= f.bound < f.high
                   for f in self.figures.values())

    def step(self) -> CapacityStep:
        """The probe as its search's line states it."""
        return CapacityStep(load=self.load, met=self.passed, why=self.why,
                            ok=sum(r.ok for r in self.records),
                            failed_share=round(self.failed_share, 4), figures=self.figures,
                            repeats=len(self.rows),
                            rows=[r.requests_file for r in self.rows if r.requests_file])


def judge(probe: Probe, target: LatencyTarget) -> Probe:
    """Fill the probe's figures and whether it met the target (see the module docstring)."""
    counted = [r for r in probe.records if not r.cancelled]
    probe.failed_share = sum(r.failed for r in counted) / len(counted) if counted else 1.0
    missed = []
    for b in target.bounds:
        sample = values(probe.records, b.metric)
        point = stats.percentile(sample, b.q) if sample else None
        found = interval(sample, b.q)
        low, high = found if found else (None, None)
        probe.figures[b.key] = BoundFigure(value=stats.round6(point), low=stats.round6(low),
                                           high=stats.round6(high), bound=b.limit_s,
                                           n=len(sample))
        if point is None:
            missed.append(f"no {b.key}")
        elif (over := _over(b, point)) is not None:
            missed.append(over)
    ok = sum(r.ok for r in probe.records)
    if ok < MIN_OK:
        missed.append(f"only {ok} successes")
    missed += _failing(probe.failed_share, target)
    probe.passed, probe.why = not missed, "; ".join(missed) or "met every bound"
    return probe


def judge_row(row: LoadRecord, target: LatencyTarget) -> tuple[bool, str] | None:
    """A level the run measured, against the target by its own percentiles and failures
    (None: interrupted, or too few successes to say)."""
    ok, failed = row.ok or 0, row.failed or 0
    if ok < MIN_OK or row.interrupted:
        return None
    missed = []
    for b in target.bounds:
        figure = getattr(row, f"{b.metric}_s")
        point = getattr(figure, f"p{b.q}") if figure is not None else None
        if point is None:
            return None
        if (over := _over(b, point)) is not None:
            missed.append(over)
    missed += _failing(failed / (ok + failed), target)
    return not missed, "; ".join(missed) or "met every bound"


def _over(b: Bound, point: float) -> str | None:
    """A percentile past its bound, in the words a probe's `why` uses (None: within it)."""
    return f"{b.key} {point:.3g} s > {b.limit_s:g} s" if point > b.limit_s else None


def _failing(share: float, target: LatencyTarget) -> list[str]:
    """The failed share past what the target allows, in the same words."""
    return [f"{share:.1%} failed > {target.errors:.1%}"] if share > target.errors else []


def _closed(row: LoadRecord) -> bool:
    """A closed-loop level of a prompt set: its concurrency is its load."""
    w = row.workload
    return row.rate is None and (w is None or w.kind == "prompt set")


def floor_missed(measured: Sequence[LoadRecord], target: LatencyTarget
                 ) -> tuple[LoadRecord, str] | None:
    """The run's level of one request at a time and why it missed the target, if it did."""
    for row in measured:
        judged = judge_row(row, target) if row.concurrency == 1 and _closed(row) else None
        if judged is not None and not judged[0]:
            return row, judged[1]
    return None


def start_from(measured: Sequence[LoadRecord], target: LatencyTarget,
               knob: Knob) -> float | None:
    """Where a search of `knob` starts from the run's closed-loop levels: the requests/s of
    the busiest that met the target (rate), or its concurrency (concurrency); None: no
    level met it, or the knob is not one they measured."""
    met = [r for r in measured if _closed(r) and (j := judge_row(r, target)) and j[0]]
    if not met or knob.name not in ("rate", "concurrency"):
        return None
    busiest = max(met, key=lambda r: r.concurrency)
    return busiest.requests_per_s if knob.name == "rate" else float(busiest.concurrency)



# --- the search ---------------------------------------------------------------------------

def probe_spec(spec: LoadSpec, knob: Knob, plan: SearchPlan, load: float,
               step: int) -> tuple[LoadSpec, int]:
    """A probe's spec at `load`, with fresh prompts (its own block), and its level."""
    level = max(spec.levels) if spec.levels else 1
    rate, trace = None, spec.trace
    floor = plan.min_requests
    if knob.name == "rate":
        level, rate = plan.in_flight_cap, load
        if not plan.floor_given:
            floor = max(MIN_OK, min(plan.min_requests, math.ceil(load * plan.duration_s)))
    elif knob.name in ("concurrency", "users"):
        level = int(load)
    elif spec.trace is not None:
        trace = replace(spec.trace, speedup=load)
    context = spec.context.model_copy(
        update={"capacity_probe": CapacityProbe(knob=knob.name, load=load, step=step)})
    return replace(spec, rate=rate, rates=(), trace=trace, levels=(level,),
                   label=capacity_label(spec.label), requests=None,
                   min_requests=floor, duration_s=plan.duration_s,
                   warmup=plan.warmup, repeat=None, block_offset=CAPACITY_BLOCK + step,
                   context=context), level


def next_load(knob: Knob, plan: SearchPlan, met: list[float],
              missed: list[float]) -> float | None:
    """The next load to try, or None when the search is done."""
    top = knob.clamp(plan.max_load or knob.highest)
    lo = max((x for x in met if not missed or x < min(missed)), default=None)
    hi = min(missed, default=None)
    if hi is None:
        assert lo is not None
        up = knob.clamp(max(lo * plan.factor, lo + 1 if knob.integer else lo))
        return None if lo >= top else min(up, top)
    if lo is None:
        down = knob.clamp(hi / plan.factor)
        return None if down >= hi else down
    if converged(knob, plan, lo, hi):
        return None
    mid = knob.clamp((lo + hi) / 2)
    return mid if lo < mid < hi else None


def converged(knob: Knob, plan: SearchPlan, lo: float, hi: float) -> bool:
    """Whether the load that met and the one that missed are within one step."""
    return hi - lo <= max(1.0 if knob.integer else 0.0, plan.resolution * lo)


@dataclass
class CapacityResult:
    record: CapacityRecord
    rows: list[LoadRecord]
    probes: list[Probe]


async def search(spec: LoadSpec, target: LatencyTarget, knob: Knob, plan: SearchPlan, *,
                 measured: Sequence[LoadRecord] = (), api_key: str = "",
                 stop: asyncio.Event | None = None,
                 on_row: Callable[[LoadRecord], object] | None = None,
                 say: Say = quiet) -> CapacityResult:
    """Find the capacity (see the module docstring), from the levels the run `measured`
    before it; every probe's row goes to `on_row`."""
    lightest = floor_missed(measured, target)
    if lightest is not None:
        record = result_record(spec, target, knob, plan, [])
        record.verdict, record.decided_by = "none-met", lightest[0].label
        record.statement = (f"no load met {target.text()}: the run's own level of one request "
                            f"at a time ({lightest[0].label}) already missed it "
                            f"({lightest[1]}); no load is lighter, so no probe was sent")
        say(f"    capacity: {record.statement}")
        return CapacityResult(record, [], [])
    inputs = await prepare_inputs(spec, api_key)
    client = metrics_client(spec, api_key)
    probes: list[Probe] = []
    load: float | None = knob.clamp(start_from(measured, target, knob) or plan.start)
    try:
        while load is not None and len(probes) < plan.max_steps:
            probe = Probe(load, [], [])
            for _ in range(plan.repeats):
                step = len(probes) * plan.repeats + len(probe.rows)
                probe_as, level = probe_spec(spec, knob, plan, load, step)
                got: Measured = await measure_level(
                    probe_as, Endpoint.from_url(spec.base_url), level, 0, api_key=api_key,
                    stop=stop, client=client, inputs=inputs)
                probe.rows.append(got.row)
                probe.records += got.result.records
                if on_row is not None:
                    on_row(got.row)
                judge(probe, target)
                if not probe.straddles or got.row.interrupted:
                    break
            probes.append(probe)
            say(f"    capacity: {knob.name} {load:g} {'met' if probe.passed else 'missed'} "
                f"the target ({probe.why})")
            if stop is not None and stop.is_set():
                break
            load = next_load(knob, plan, [p.load for p in probes if p.passed],
                             [p.load for p in probes if not p.passed])
    finally:
        if client is not None:
            await client.aclose()
    record = result_record(spec, target, knob, plan, probes)
    return CapacityResult(record, [r for p in probes for r in p.rows], probes)


def result_record(spec: LoadSpec, target: LatencyTarget, knob: Knob, plan: SearchPlan,
                  probes: list[Probe]) -> CapacityRecord:
    """The search's notebook line: the capacity, the bracket, every probe."""
    met = sorted(p.load for p in probes if p.passed)
    missed = sorted(p.load for p in probes if not p.passed)
    hi = missed[0] if missed else None
    lo = max((x for x in met if hi is None or x < hi), default=None)
    verdict: Literal["found", "not-converged", "at-least", "none-met"]
    if lo is None:
        verdict = "none-met"
    elif hi is None:
        verdict = "at-least"
    else:
        verdict = "found" if converged(knob, plan, lo, hi) else "not-converged"
    out_of_order = [x for x in met if hi is not None and x > hi]
    record = CapacityRecord(
        label=capacity_label(spec.label), lab=spec.lab, run_id=spec.run_id, knob=knob.name,
        unit=knob.unit,
        target=CapacityTarget(slo=target.text(),
                              bounds={b.key: b.limit_s for b in target.bounds},
                              errors=target.errors),
        capacity=lo, met_below=lo, missed_at=hi, verdict=verdict,
        statement=statement(target, knob, verdict, lo, hi, probes),
        steps=[p.step() for p in probes], model=spec.model, base_url=spec.base_url,
        workload=spec.workload(max(spec.levels) if spec.levels else 1),
        prompt_set=spec.prompt_set, max_tokens=spec.max_tokens,
        method=CapacityMethod(start=plan.start, factor=plan.factor, resolution=plan.resolution,
                              max_steps=plan.max_steps, duration_s=plan.duration_s,
                              min_requests=plan.min_requests, repeats=plan.repeats,
                              interval="95% percentile bootstrap over the probe's successes",
                              due="TTFT and E2E from when each request was due"),
        not_monotonic=out_of_order or None)
    record.overlay(spec.context)
    record.capacity_probe = None  # each probe's own, on its load rows
    return record


def statement(target: LatencyTarget, knob: Knob, verdict: str, lo: float | None, hi: float | None,
              probes: list[Probe]) -> str:
    slo = target.text()
    by_load = {p.load: p for p in probes}
    if verdict == "none-met" and not by_load:
        return f"no load met {slo}: no probe was sent"
    if verdict == "none-met":
        low = min(by_load)
        return (f"no load met {slo}: even {low:g} {knob.unit} missed it "
                f"({by_load[low].why})")
    assert lo is not None
    if verdict == "at-least":
        return (f"at least {lo:g} {knob.unit} at {slo}: every load tried met it, up to "
                f"{lo:g} (the search stopped there)")
    assert hi is not None
    word = "" if verdict == "found" else " (not converged: the probes ran out)"
    return (f"{lo:g} {knob.unit} at {slo}{word}: {lo:g} met it, {hi:g} missed it "
            f"({by_load[hi].why})")


def check_knob(knob: Knob, spec: LoadSpec) -> None:
    """Refuse a knob the workload has no handle for."""
    if knob.name == "users" and spec.sessions is None:
        raise InputError("--capacity-knob users: give --users (user sessions)")
    if knob.name == "speedup" and spec.trace is None:
        raise InputError("--capacity-knob speedup: give --trace")
    if knob.name in ("rate", "concurrency") and (spec.sessions or spec.trace):
        raise InputError(f"--capacity-knob {knob.name}: user sessions search users, a trace "
                         "its speed-up")


@dataclass(frozen=True)
class CapacityAsk:
    """An experiment's capacity search: the target and how to search (`SearchPlan`)."""

    slo: str
    plan: SearchPlan = SearchPlan()

    def target(self) -> LatencyTarget:
        return LatencyTarget.parse(self.slo)
