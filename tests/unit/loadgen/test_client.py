"""The raw client and level runner on real sockets, against a fake upstream for the faults."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise

import httpx
import pytest

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core.errors import UnreachableError
from kvlab.engines.ports import free_port
from kvlab.loadgen import stats
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.payloads import level_payloads
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.runner import LevelRun, Schedule
from kvlab.loadgen.sweep import LoadSpec, run_level


def spec(url: str, requests: int, **kw: object) -> LoadSpec:
    values: dict[str, object] = {"base_url": url, "model": "fake", "levels": (2,),
                                 "requests": requests, "max_tokens": 6,
                                 "prompt_set": "shared-prefix", "label": "t",
                                 "preamble_tokens": 40, "scrape_metrics": False,
                                 "warmup": 0}  # the client's faults, counted exactly
    values.update(kw)
    return LoadSpec(**values)  # type: ignore[arg-type]


async def test_one_in_three_fails_and_percentiles_use_successes_only() -> None:
    async with SseUpstream(Behaviour(fail_every=3)) as up:
        s = spec(up.base_url, 9)
        row = await run_level(s, Endpoint.from_url(up.base_url), 2, 0)
    assert up.counters.requests == 9 and up.counters.failed == 3
    assert (row.ok, row.failed, row.cancelled) == (6, 3, 0)
    assert row.errors == {"http 500": 3}
    assert row.failures[0].status == 500 and "injected" in row.failures[0].detail
    # every success streamed 6 tokens; failures contributed nothing to the token counts
    assert row.output_tokens == 36 and row.tokens_from == "usage"
    assert row.ttft_s.max < 1.0


async def test_stalled_stream_is_a_timeout_failure() -> None:
    async with SseUpstream(Behaviour(stall_every=2, tokens=4)) as up:
        row = await run_level(spec(up.base_url, 4, timeout_s=0.5), Endpoint.from_url(up.base_url),
                              2, 0)
    assert up.counters.stalled == 2
    assert (row.ok, row.failed) == (2, 2)
    assert row.errors == {"timeout": 2}
    # the stalled requests' half-streams are not in the success timings
    assert row.e2e_s.max < 0.5


async def test_stop_keeps_what_was_measured() -> None:
    async with SseUpstream(Behaviour(tokens=10, itl_s=0.02)) as up:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        row = await run_level(spec(up.base_url, 12), Endpoint.from_url(up.base_url), 2, 0,
                              stop=stop)
    assert row.interrupted is True
    assert row.cancelled >= 1 and row.ok >= 1
    assert row.ok + row.failed + row.cancelled == row.requests
    assert row.requests_planned == 12 and row.requests < 12
    assert row.failed == 0


async def test_server_closing_each_connection() -> None:
    async with SseUpstream(Behaviour(close_after=True, tokens=3)) as up:
        row = await run_level(spec(up.base_url, 6), Endpoint.from_url(up.base_url), 2, 0)
    assert row.ok == 6 and row.failed == 0
    assert row.connections_opened >= 6


async def test_counter_deltas_across_an_engine_restart() -> None:
    async with SseUpstream(Behaviour(tokens=2, prompt_tokens=100)) as up:
        up.counters.prefix_hits, up.counters.prefix_queries = 1000.0, 2000.0
        done: list[RequestRecord] = []

        def restart_after_first(record: RequestRecord) -> None:
            done.append(record)
            if len(done) == 1:
                up.restart_counters()

        s = spec(up.base_url, 4, scrape_metrics=True)
        async with httpx.AsyncClient(trust_env=False) as client:
            row = await run_level(s, Endpoint.from_url(up.base_url), 1, 0,
                                  progress=restart_after_first, client=client)
    # after the reset the counters restarted from zero: the delta is what was counted since
    assert row.metric_deltas["prefix_cache_hits"] == 150
    assert row.metric_deltas["prefix_cache_queries"] == 300
    assert row.prefix_hit_rate == 0.5


async def test_open_loop_keeps_its_schedule() -> None:
    async with SseUpstream(Behaviour(tokens=2, ttft_s=0.001, itl_s=0.001)) as up:
        target = Endpoint.from_url(up.base_url)
        payloads = level_payloads(spec(up.base_url, 20), target, 0)
        result = await LevelRun(target, payloads, Schedule(concurrency=8, rate=100.0,
                                                           burstiness=float("inf")),
                                timeout_s=5).run()
    sent = [r.sent_ns for r in result.records]
    gaps = [(b - a) / 1e6 for a, b in pairwise(sent)]
    assert 5 < sum(gaps) / len(gaps) < 20  # 10 ms apart on average, generously
    assert all(r.scheduled_ns == result.start_ns + i * 10_000_000
               for i, r in enumerate(result.records))
    assert all(stats.lag_s(r) is not None for r in result.records)


async def test_api_key_is_sent_and_never_recorded() -> None:
    async with SseUpstream(Behaviour(tokens=2)) as up:
        row = await run_level(spec(up.base_url, 2), Endpoint.from_url(up.base_url), 1, 0,
                              api_key="sk-test-do-not-write")
    assert up.counters.authorization == ["Bearer sk-test-do-not-write"] * 2
    assert "sk-test-do-not-write" not in json.dumps(row.line())
    assert up.counters.bodies[0]["stream_options"] == {"include_usage": True}


async def test_unreachable_server_is_one_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(UnreachableError, match="cannot connect"):
        await run_level(spec(url, 2), Endpoint.from_url(url), 1, 0)
