"""KV-cache usage over time: a background scrape of an engine's gauges during a workload.

Pressure must be stated, not hoped for; the peak of `vllm:kv_cache_usage_perc` (and the
running/waiting queue) sampled while the load runs is the record of what was reached.

The scrapes run in a child process (`main` here, with URL and INTERVAL), never on
the caller's event loop: parsing a large vLLM /metrics page (200 kB is tens of ms of pure
Python in prometheus_client's parser) on the load generator's loop, or in a thread of its
process (which must take the GIL to parse), delays the loop and shows up as TTFT timing error.
The child runs at a lower CPU priority, stamps each reading when the page arrived, and writes
one JSON line per reading; the caller's loop only reads those short lines. The child exits
when its stdin closes, so it cannot outlive the process that started it.

The child's CPU still competes with the load generator's on a small machine, so it does its
imports before `ready` and parses no more than it needs: prometheus_client's parser yields
one metric family at a time, and the child stops once it has read each evidence gauge's
preferred name (vLLM exports its gauges before its histograms: about the first 12% of the
page). A reading equals what a whole-page parse would give as long as each metric's lines
form one group, as the exposition format requires; a page without the preferred names is
parsed to its end. `benchmarks/loadgen_accuracy.py --sampler-ab` measures what is left.

Protocol: the child prints `ready` once it can scrape; the parent answers with one line, the
monotonic time that is t = 0 (CLOCK_MONOTONIC is one clock for every process on Linux); the
child then scrapes at t = 0, interval, 2 x interval, ... (a late scrape skips the ticks it
missed) until stdin reaches EOF. Not here: counter deltas, whole-page parses (`metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvlab.observe import metrics
from kvlab.records import KvSamples

SCRAPE_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 30.0  # a cold interpreter on a loaded 2-core machine
STOP_GRACE_S = SCRAPE_TIMEOUT_S + 2.0  # a scrape in flight when asked to stop may finish
# Below the load generator's priority: under CPU contention the kernel runs the client's
# event loop first; a reading that comes late is still stamped when its page arrived.
CHILD_NICE = 10


@dataclass
class Samples:
    """(seconds since start, gauge values) pairs."""

    points: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def peak(self, key: str) -> float | None:
        values = [p[key] for _, p in self.points if key in p]
        return max(values) if values else None

    def as_record(self) -> KvSamples:
        """The samples as a row states them: each gauge's series beside the times."""
        def series(key: str) -> list[float | None] | None:
            if not any(key in p for _, p in self.points):
                return None
            return [p.get(key) for _, p in self.points]
        return KvSamples(t_s=[round(t, 2) for t, _ in self.points],
                         kv_cache_usage_perc=series("kv_cache_usage_perc"),
                         requests_running=series("requests_running"),
                         requests_waiting=series("requests_waiting"),
                         offload_store_bytes=series("offload_store_bytes"),
                         offload_load_bytes=series("offload_load_bytes"))


@contextlib.asynccontextmanager
async def sampling(metrics_url: str, gauges: metrics.GaugeTable,
                   interval_s: float = 0.5) -> AsyncIterator[Samples]:
    """Scrape `metrics_url` every `interval_s` (in a child process) while the block runs,
    reading the engine's `gauges` (its adapter's table)."""
    if not interval_s > 0:
        raise ValueError(f"interval_s must be positive, not {interval_s}")
    samples = Samples()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, metrics_url, repr(interval_s), json.dumps(gauges),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        start_new_session=True)  # Ctrl-C reaches kvlab, which then stops the child
    reader: asyncio.Task[None] | None = None
    try:
        await _start(proc)
        reader = asyncio.create_task(_read(proc, samples))
        yield samples
    finally:
        await _stop(proc, reader)


async def _start(proc: asyncio.subprocess.Process) -> None:
    """Wait for the child's `ready`, then tell it where t = 0 is."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            line = await proc.stdout.readline()
    except TimeoutError:
        raise RuntimeError(
            f"the metrics sampler did not start within {READY_TIMEOUT_S} s") from None
    if line != b"ready\n":
        code = await proc.wait()
        raise RuntimeError(f"the metrics sampler exited with status {code} before starting")
    proc.stdin.write(f"{time.monotonic()!r}\n".encode())
    await proc.stdin.drain()


async def _read(proc: asyncio.subprocess.Process, samples: Samples) -> None:
    """Append each reading line to `samples` until the child's stdout closes."""
    assert proc.stdout is not None
    async for line in proc.stdout:
        got = json.loads(line)
        samples.points.append((float(got["t"]), got["point"]))


async def _stop(proc: asyncio.subprocess.Process, reader: asyncio.Task[None] | None) -> None:
    """Close the child's stdin, wait for it (kill it past the grace), drain its last lines."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if reader is not None:
            await reader
    except BaseException:  # cancelled while stopping: the child must still go, then re-raise
        if proc.returncode is None:
            proc.kill()
        if reader is not None:
            reader.cancel()
        raise


# --- the child process -----------------------------------------------------------------------
def parse_until_gauges(text: str, gauges: metrics.GaugeTable,
                       url: str = "") -> metrics.Snapshot:
    """The page's families up to the last of `gauges` (all of them if one is missing)."""
    snap = metrics.Snapshot(url=url)
    unread = {names[0] for names in gauges.values()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:  # as metrics.parse does, one family at a time
            if not sample.name.endswith("_created"):
                snap.series[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
        unread.discard(family.name)
        if not unread:
            break
    return snap


def _scrape(client: httpx.Client, url: str,
            gauges: metrics.GaugeTable) -> tuple[float, dict[str, float]] | None:
    """(when the page arrived, its gauges), or None when the page could not be read."""
    try:
        response = client.get(url)
        arrived = time.monotonic()
        if response.status_code != 200:
            return None
        return arrived, metrics.gauge_reading(parse_until_gauges(response.text, gauges, url),
                                              gauges)
    except (httpx.HTTPError, ValueError):
        return None


def _stdin_closed(wait_s: float) -> bool:
    """Wait up to `wait_s` for stdin to reach EOF (the parent's signal to stop)."""
    fd = sys.stdin.fileno()
    readable, _, _ = select.select([fd], [], [], max(0.0, wait_s))
    return bool(readable) and not os.read(fd, 4096)


def _child(url: str, interval_s: float, gauges: metrics.GaugeTable) -> None:
    os.nice(CHILD_NICE)
    with httpx.Client(timeout=SCRAPE_TIMEOUT_S, trust_env=False) as client:
        print("ready", flush=True)
        start = sys.stdin.readline()
        if not start:
            return
        t0 = float(start)
        tick = 0
        while True:
            got = _scrape(client, url, gauges)
            if got is not None:
                print(json.dumps({"t": got[0] - t0, "point": got[1]}), flush=True)
            tick = max(tick + 1, int((time.monotonic() - t0) / interval_s) + 1)
            if _stdin_closed(t0 + tick * interval_s - time.monotonic()):
                return


# the child imports this module and calls `main` (`-m` would run it a second time beside the
# copy its package already imported, which Python warns of on the user's console)
CHILD = f"import sys; from {__name__} import main; main(sys.argv[1:])"


def main(argv: list[str]) -> None:
    url, interval, table = argv
    gauges = {str(k): tuple(str(n) for n in v) for k, v in json.loads(table).items()}
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        _child(url, float(interval), gauges)


if __name__ == "__main__":
    main(sys.argv[1:])
