"""A level's phases on real sockets: warm-up left out of the statistics, timed levels, counts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fakes import fault_upstream
from fakes.fault_upstream import FaultUpstream
from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core.errors import InputError
from kvlab.engines.ports import free_port
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.payloads import level_payloads
from kvlab.loadgen.runner import LevelRun, Schedule, Until
from kvlab.loadgen.sweep import WARMUP_OFFSET, LoadSpec, run_level, run_sweep
from kvlab.measure import compare
from kvlab.proxy import ProxyConfig, running
from kvlab.records import notebook, requests
from kvlab.records.models import LinkRecord, LoadRecord, Percentiles


def spec(url: str, book: Path | None = None, **kw: object) -> LoadSpec:
    values: dict[str, object] = {"base_url": url, "model": "fake", "levels": (2,),
                                 "requests": 5, "max_tokens": 4,
                                 "prompt_set": "shared-prefix", "label": "lv",
                                 "preamble_tokens": 40, "scrape_metrics": False,
                                 "labbook": str(book) if book else ""}
    values.update(kw)
    return LoadSpec(**values)  # type: ignore[arg-type]


def file_lines(book: Path, row: LoadRecord) -> list[requests.RequestLine]:
    assert row.requests_file is not None
    return requests.read(requests.location(book, row.requests_file), row.requests_sha256)


def question(body: dict[str, object]) -> str:
    return str(body["messages"][-1]["content"])  # type: ignore[index]


async def test_warmup_is_sent_first_marked_and_left_out(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    async with SseUpstream(Behaviour(tokens=4)) as up:
        row = await run_level(spec(up.base_url, book, warmup=3), Endpoint.from_url(up.base_url),
                              2, 0)
    assert up.counters.requests == 8  # 3 warm-up + 5 measured
    assert row.warmup_requests == 3 and row.requests == row.ok == 5
    assert row.ttft_s is not None and row.ttft_s.n == 5 and row.e2e_s.n == 5
    assert row.output_tokens == 20  # the warm-up's 12 tokens are not in the throughput
    lines = file_lines(book, row)
    assert [x.warmup for x in lines] == [True] * 3 + [False] * 5
    assert [x.id for x in lines] == list(range(8)) and {x.level for x in lines} == {2}
    warm, measured = lines[:3], lines[3:]
    # the warm-up's prompts come from their own range: same preamble, other questions
    assert all(x.prompt_index is not None and x.prompt_index >= WARMUP_OFFSET for x in warm)
    assert [x.prompt_index for x in measured] == list(range(5))
    bodies = up.counters.bodies
    assert {question(b) for b in bodies[:3]}.isdisjoint(question(b) for b in bodies[3:])
    assert len({str(b["messages"][0]) for b in bodies}) == 1  # type: ignore[index]
    assert all(x.sent_s is not None and x.sent_s >= 0 for x in lines)
    assert measured[0].sent_s >= max(x.end_s or 0 for x in warm)  # type: ignore[operator]
    assert all(x.ttft_s and x.output_tokens == 4 and x.prompt_tokens == 100 for x in lines)


async def test_default_warmup_is_one_per_concurrent_request(tmp_path: Path) -> None:
    async with SseUpstream(Behaviour(tokens=2)) as up:
        s = spec(up.base_url, levels=(1, 3), requests=2)
        rows = (await run_sweep(s)).rows
    assert [r.warmup_requests for r in rows] == [1, 3]
    assert up.counters.requests == 1 + 2 + 3 + 2
    assert all(r.requests_file is None for r in rows)  # no notebook named: no file


async def test_timed_level_runs_its_duration_and_at_least_its_minimum(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    async with SseUpstream(Behaviour(tokens=3, ttft_s=0.01, itl_s=0.005)) as up:
        s = spec(up.base_url, book, requests=None, min_requests=3, duration_s=0.6, warmup=1)
        row = await run_level(s, Endpoint.from_url(up.base_url), 2, 0)
    assert row.duration_reached is True and row.duration_s >= 0.6
    assert row.requests > 3 and row.failed == 0 and row.min_requests == 3
    lines = file_lines(book, row)
    measured = [x for x in lines if not x.warmup]
    assert len(measured) == row.requests
    start = measured[0].sent_s or 0.0
    assert max(x.sent_s or 0 for x in measured) - start < 0.6  # none released after the time
    assert len({x.prompt_index for x in measured}) == len(measured)


async def test_timed_level_without_more_requests_says_it_stopped_short() -> None:
    async with SseUpstream(Behaviour(tokens=2)) as up:
        target = Endpoint.from_url(up.base_url)
        payloads = level_payloads(spec(up.base_url, requests=4), target, 0)
        result = await LevelRun(target, payloads, Schedule(concurrency=2), timeout_s=5,
                                until=Until(2, 5.0)).run()
    assert len(result.records) == 4 and result.exhausted and result.built_during == 0


def test_request_counts_default_to_enough_for_a_p99() -> None:
    url = "http://127.0.0.1:9/v1"
    auto = spec(url, requests=None)
    assert (auto.floor(1), auto.floor(8), auto.floor(64)) == (200, 200, 640)
    assert spec(url, requests=24).floor(8) == 24  # the user's REQUESTS wins
    assert spec(url, requests=None, min_requests=50).floor(8) == 50
    assert spec(url, requests=24, min_requests=50).floor(8) == 50
    assert auto.warmup_for(8) == 8 and spec(url, warmup=0).warmup_for(8) == 0
    with pytest.raises(InputError, match="--duration"):
        spec(url, duration_s=0.0)
    with pytest.raises(InputError, match="--warmup"):
        spec(url, warmup=-1)


def test_open_loop_duration_counts_the_arrivals_within_it() -> None:
    even = Schedule(concurrency=4, rate=10.0, burstiness=float("inf"))
    assert even.within(1.0, 1000) == 10 and even.within(1.0, 5) == 5
    poisson = Schedule(concurrency=4, rate=50.0, seed=3)
    offsets = poisson.offsets_ns(1000)
    assert poisson.within(2.0, 1000) == sum(1 for o in offsets if o < 2e9)


async def test_stopped_during_warmup_measures_nothing(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    async with SseUpstream(Behaviour(tokens=20, itl_s=0.05)) as up:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        row = await run_level(spec(up.base_url, book, warmup=2, max_tokens=20),
                              Endpoint.from_url(up.base_url), 2, 0, stop=stop)
    assert row.interrupted is True and row.requests == 0 and row.unsent == 5
    assert row.warmup_cancelled == 2 and row.ttft_s is None
    assert [x.status for x in file_lines(book, row)] == ["cancelled", "cancelled"]


async def test_the_failed_leg_through_kvlabs_proxy_is_in_the_file(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    dying = fault_upstream.Behaviour(mode="die", chunks=6, die_after=2)
    async with FaultUpstream() as prefill, FaultUpstream(dying) as decode:
        config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0)
        async with running(config) as app:
            s = spec(app.url + "/v1", book, model="fake-model", endpoint="completions",
                     requests=2, warmup=1, max_tokens=6, label="split")
            row = await run_level(s, Endpoint.from_url(s.base_url), 1, 0)
        config = ProxyConfig(prefill=(f"127.0.0.1:{free_port()}",), decode=(decode.url,),
                             port=0, compat=None)  # nothing listens where prefill should be
        async with running(config) as app:
            s = spec(app.url + "/v1", book, model="fake-model", endpoint="completions",
                     requests=2, warmup=0, max_tokens=6, label="split-down")
            down = await run_level(s, Endpoint.from_url(s.base_url), 1, 0)
    mid = file_lines(book, row)
    assert [(x.status, x.failed_leg) for x in mid] == [("failed", "decode")] * 3
    assert all(x.error == "error event" and "mid-stream" in (x.error_detail or "")
               for x in mid)
    refused = file_lines(book, down)
    assert [(x.http_status, x.failed_leg) for x in refused] == [(503, "prefill")] * 2


def test_link_bytes_per_request_count_the_warmup_requests_too(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    for label in ("disagg", "baseline"):
        for level in (1, 4):  # 8 measured requests after `level` warm-up ones
            notebook.append(book, LoadRecord(label=label, lab=notebook.LAB_PD,
                                             concurrency=level, requests=8, ok=8, failed=0,
                                             warmup_requests=level,
                                             ttft_s=Percentiles(p50=0.1),
                                             tpot_s=Percentiles(p50=0.01)))
    notebook.append(book, LinkRecord(label="disagg", lab=notebook.LAB_PD, base_url="u",
                                     connector="shared", iface="lo", rx_bytes=2_100_000,
                                     tx_bytes=0, requests=8))
    result = compare.compare_runs(notebook.read(book).records, str(book), "disagg", "baseline")
    # the counters ran over 16 measured and 5 warm-up requests
    assert result.record.line()["observed_bytes_per_request"] == 2_100_000 / 21
