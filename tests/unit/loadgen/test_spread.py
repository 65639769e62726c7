"""An open-loop level spread over processes sharing its schedule, on real sockets: the same
arrivals as one loop would release, the level's own indices back, the cap split, a stop that
reaches every process, and a failed process said as such."""

from __future__ import annotations

import asyncio

import pytest

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core import EngineError
from kvlab.loadgen import spread
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.record import decode_events
from kvlab.loadgen.runner import Schedule


def payloads(target: Endpoint, n: int) -> list[tuple[int, bytes]]:
    return [(i, target.request_bytes("/completions", {
        "model": "fake", "prompt": f"p{i}", "max_tokens": 2, "stream": True},
        request_id=f"r-{i}")) for i in range(n)]


def test_processes_are_as_many_as_keep_each_loop_half_busy() -> None:
    assert spread.processes_for(None, 0.001, 8) == 1  # a closed loop is never spread
    assert spread.processes_for(200.0, None, 8) == 1  # no warm-up measured: one loop
    assert spread.processes_for(200.0, 0.001, 8) == 1  # 0.2 of a core
    assert spread.processes_for(600.0, 0.001, 8) == 2  # 0.6
    assert spread.processes_for(4000.0, 0.001, 8) == 7  # one core left to the rest
    assert spread.processes_for(4000.0, 0.001, 2) == 1  # two cores: one loop measured better


def test_shares_keep_each_arrival_and_split_the_cap() -> None:
    target = Endpoint("127.0.0.1", 1, False, "/v1")
    schedule = Schedule(concurrency=5, rate=100.0, seed=3)
    parts = spread.shares(target, payloads(target, 7), schedule, 3, 10.0, None)
    offsets = schedule.offsets_ns(7)
    assert [p.indices for p in parts] == [(0, 3, 6), (1, 4), (2, 5)]
    assert all(p.concurrency == 2 for p in parts)  # ceil(5 / 3)
    for part in parts:
        assert list(part.offsets_ns) == [offsets[i] for i in part.indices]
        assert [q for q, _ in part.payloads] == list(part.indices)
    assert len(spread.shares(target, payloads(target, 1), schedule, 3, 10.0, None)) == 1


async def test_a_spread_level_sends_the_one_schedule_and_merges_its_records() -> None:
    async with SseUpstream(Behaviour(tokens=2, ttft_s=0.002, itl_s=0.001)) as up:
        target = Endpoint.from_url(up.base_url)
        schedule = Schedule(concurrency=16, rate=200.0, seed=1)
        sent = payloads(target, 40)
        result = await spread.run_spread(target, sent, schedule, 2, timeout_s=20.0)
        assert up.counters.requests == 40
    assert [r.index for r in result.records] == list(range(40))
    offsets = schedule.offsets_ns(40)
    for r in result.records:
        decode_events(r)
        assert r.ok, r
        assert r.scheduled_ns == result.start_ns + offsets[r.index]  # the same arrivals
        assert r.request_id == f"r-{r.index}" and r.sent_ns >= r.scheduled_ns
    assert not result.interrupted and result.unsent == 0 and result.connections_opened >= 2
    assert result.end_ns >= max(r.end_ns for r in result.records)


async def test_a_stop_reaches_every_process_and_what_was_measured_comes_back() -> None:
    async with SseUpstream(Behaviour(tokens=2)) as up:
        target = Endpoint.from_url(up.base_url)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(1.5, stop.set)  # processes start in well under
        result = await spread.run_spread(target, payloads(target, 400),
                                         Schedule(concurrency=8, rate=40.0), 2,
                                         timeout_s=20.0, stop=stop)
    assert result.interrupted and 0 < len(result.records) < 400
    assert result.unsent == 400 - len(result.records)


async def test_an_unreachable_server_is_a_failure_with_its_cause() -> None:
    target = Endpoint("127.0.0.1", 9, False, "/v1")  # discard: nothing listens
    with pytest.raises(EngineError, match="a load process failed: UnreachableError"):
        await spread.run_spread(target, payloads(target, 4), Schedule(concurrency=2, rate=10.0),
                                2, timeout_s=5.0)


async def test_a_closed_loop_is_not_spread() -> None:
    target = Endpoint("127.0.0.1", 9, False, "/v1")
    with pytest.raises(ValueError, match="open-loop"):
        await spread.run_spread(target, [], Schedule(concurrency=2), 2, timeout_s=5.0)


async def test_a_load_level_says_how_many_processes_sent_it() -> None:
    from kvlab.loadgen.sweep import LoadSpec, run_sweep
    from kvlab.records.models import LoadRecord

    async with SseUpstream(Behaviour(tokens=2)) as up:
        base = {"base_url": up.base_url, "model": "fake", "levels": (4,), "requests": 24,
                "max_tokens": 2, "prompt_set": "shared-prefix", "label": "sp",
                "preamble_tokens": 20, "scrape_metrics": False, "rate": 100.0}
        forced, auto = [
            next(r for r in (await run_sweep(LoadSpec(**base, processes=n))).rows  # type: ignore[arg-type]
                 if isinstance(r, LoadRecord)) for n in (2, None)]
    assert forced.client_processes == 2 and forced.ok == 24 and forced.failed == 0
    assert forced.schedule_lag_s is not None and forced.schedule_lag_s.n == 24
    # 100 requests/s is far below what one loop carries here: not spread, and the warm-up's
    # CPU per request, from which that was decided, is in the row
    assert auto.client_processes is None and auto.ok == 24
    assert auto.client_cpu_per_request_s is not None and auto.client_cpu_per_request_s > 0
