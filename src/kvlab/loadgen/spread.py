"""One open-loop level sent by several processes that share its schedule.

One event loop sends, reads and stamps every request of a level; past some rate it cannot keep
up, and the requests it releases late show as scheduling lag (and as timing error: a busy loop
reads its bytes late). A level whose rate one loop cannot carry is spread:

- The level's arrival offsets are drawn once, as for one loop (`Schedule.offsets_ns`), and
  request i goes to process i mod N, with its own offset: the arrivals are the same ones.
- Each process (spawned: nothing inherited but its share) opens its connections, says it is
  ready, and starts at one start stamp the parent gives all of them (`perf_counter_ns`,
  CLOCK_MONOTONIC on Linux: one clock for every process of the machine), on its own loop.
- The cap on requests in flight is split between them (ceil(c / N) each): a process whose
  share is at its cap waits, as one loop would, and that wait is lag.
- Their records come back with the level's own indices and merge into one `LevelResult`, so
  lag, timing and every statistic are computed once over all of them.

How many: `processes_for` from the client's own CPU time per request, measured on the level's
warm-up: a loop kept busier than `BUSY_SHARE` of a core releases late often enough to show in
the lag's tail, so the level gets as many processes as keep each under it, leaving one core to
everything else (the server under test may be on this machine: on two cores, with the synthetic
upstream beside it, two processes measured worse than one, `docs/benchmarks.md`). A closed
loop is never spread: its next request waits for a response anyway.

A stop (Ctrl-C) reaches every process: each cancels what it has in flight, as one loop would.
The per-request progress bar moves when the processes are done, not as each request ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from kvlab.core import EngineError
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.runner import LevelResult, LevelRun, Schedule

BUSY_SHARE = 0.5  # of a core: the most one loop is given before a level is spread
START_AHEAD_S = 0.05  # from the last process ready to the shared start
READY_TIMEOUT_S = 60.0
STOP = "stop"  # the parent's word to every process: end the level now
FAILED = "failed: "  # a process's message saying why it has no records


def processes_for(rate: float | None, cpu_per_request_s: float | None,
                  cores: int | None = None) -> int:
    """How many processes send an open-loop level of `rate` requests/s when one request
    costs the client `cpu_per_request_s` of CPU (1: one loop carries it)."""
    if rate is None or not cpu_per_request_s or cpu_per_request_s <= 0:
        return 1
    most = max(1, (cores if cores is not None else (os.cpu_count() or 1)) - 1)
    return max(1, min(most, math.ceil(rate * cpu_per_request_s / BUSY_SHARE)))


@dataclass(frozen=True)
class Share:
    """What one process sends: its requests (the level's indices), their offsets from the
    shared start, and its part of the cap."""

    target: Endpoint
    indices: tuple[int, ...]
    payloads: tuple[tuple[int, bytes], ...]
    offsets_ns: tuple[int, ...]
    concurrency: int
    timeout_s: float
    max_s: float | None


def shares(target: Endpoint, payloads: Sequence[tuple[int, bytes]], schedule: Schedule,
           processes: int, timeout_s: float, max_s: float | None) -> list[Share]:
    """The level dealt out: request i to process i mod `processes`, its arrival unchanged."""
    offsets = schedule.offsets_ns(len(payloads))
    cap = math.ceil(schedule.concurrency / processes)
    out = []
    for k in range(processes):
        mine = tuple(range(k, len(payloads), processes))
        out.append(Share(target, mine, tuple(payloads[i] for i in mine),
                         tuple(offsets[i] for i in mine), cap, timeout_s, max_s))
    return [s for s in out if s.indices]


async def run_spread(target: Endpoint, payloads: Sequence[tuple[int, bytes]],
                     schedule: Schedule, processes: int, *, timeout_s: float,
                     max_s: float | None = None, stop: asyncio.Event | None = None
                     ) -> LevelResult:
    """The level sent by `processes` processes on one schedule, merged (see the module)."""
    if not schedule.open_loop:
        raise ValueError("only an open-loop level is spread")
    ctx = multiprocessing.get_context("spawn")
    parts = shares(target, payloads, schedule, processes, timeout_s, max_s)
    pipes, procs = [], []
    try:
        for part in parts:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_process, args=(part, theirs), daemon=True,
                               name="kvlab-load-share")
            proc.start()
            theirs.close()
            pipes.append(mine)
            procs.append(proc)
        for pipe in pipes:
            if (said := await _receive(pipe, READY_TIMEOUT_S)) != "ready":
                raise EngineError(f"a load process said {said!r} before it was ready")
        start = time.perf_counter_ns() + round(START_AHEAD_S * 1e9)
        for pipe in pipes:
            pipe.send(start)
        relay = asyncio.ensure_future(_relay_stop(stop, pipes)) if stop else None
        try:
            results = await asyncio.gather(*(_receive(p, None) for p in pipes))
        finally:
            if relay is not None:
                relay.cancel()
        return merge([_records(r) for r in results], parts, start)
    finally:  # one failed: the others stop too; joined off the loop
        _tell(pipes, STOP)
        await asyncio.to_thread(_reap, procs)
        for pipe in pipes:
            pipe.close()


def _tell(pipes: Sequence[Connection], word: str) -> None:
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.send(word)


def _reap(procs: Sequence[BaseProcess]) -> None:
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()


async def _relay_stop(stop: asyncio.Event, pipes: Sequence[Connection]) -> None:
    """Ctrl-C in the parent stops every process (each ends its level as one loop would)."""
    await stop.wait()
    _tell(pipes, STOP)


async def _receive(pipe: Connection, timeout_s: float | None) -> object:
    """The next message from a process, read off the loop; its failure or death is an error."""
    def read() -> object:
        if not pipe.poll(timeout_s):
            raise EngineError(f"a load process did not start within {timeout_s:.0f} s")
        return pipe.recv()

    try:
        said = await asyncio.get_running_loop().run_in_executor(None, read)
    except EOFError:
        raise EngineError("a load process died before it reported") from None
    if isinstance(said, str) and said.startswith(FAILED):
        raise EngineError(f"a load process failed: {said.removeprefix(FAILED)}")
    return said


def _records(said: object) -> LevelResult:
    if not isinstance(said, LevelResult):
        raise EngineError(f"a load process sent {type(said).__name__}, not its records")
    return said


def merge(results: Sequence[LevelResult], parts: Sequence[Share], start_ns: int
          ) -> LevelResult:
    """The processes' results as one level's: records under the level's own indices."""
    records = []
    retried: list[int] = []
    for result, part in zip(results, parts, strict=True):
        for record in result.records:
            record.index = part.indices[record.index]
            records.append(record)
        retried += [part.indices[i] for i in result.retried]
    records.sort(key=lambda r: r.index)
    return LevelResult(
        records=records, start_ns=start_ns,
        end_ns=max([r.end_ns for r in results] + [start_ns]),
        interrupted=any(r.interrupted for r in results),
        unsent=sum(r.unsent for r in results),
        connections_opened=sum(r.connections_opened for r in results),
        retried=sorted(retried), cut_at_max_s=any(r.cut_at_max_s for r in results))


# --- in each process ----------------------------------------------------------------------
def _process(part: Share, pipe: Connection) -> None:
    """A process's life: its loop, its share, its records sent back (or why not)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent says when to stop
    try:
        with _runner() as runner:
            result = runner.run(_send_share(part, pipe))
        pipe.send(result)
    except Exception as exc:  # the parent raises it, naming the process's failure
        with contextlib.suppress(OSError):
            pipe.send(f"{FAILED}{type(exc).__name__}: {exc}")
    finally:
        pipe.close()


def _runner() -> asyncio.Runner:
    """uvloop where it is installed (as `kvlab load` runs), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


async def _send_share(part: Share, pipe: Connection) -> LevelResult:
    run = LevelRun(part.target, part.payloads,
                   Schedule(concurrency=part.concurrency, arrivals_ns=part.offsets_ns),
                   timeout_s=part.timeout_s, max_s=part.max_s)
    await run.warm()
    pipe.send("ready")
    loop = asyncio.get_running_loop()
    start = await loop.run_in_executor(None, pipe.recv)
    stop = asyncio.Event()
    threading.Thread(target=_watch, args=(pipe, loop, stop), daemon=True).start()
    return await run.run(stop, start_ns=int(start))


def _watch(pipe: Connection, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """The parent's stop, passed to this process's loop (a thread that only waits for it)."""
    try:
        said = pipe.recv()
    except (EOFError, OSError):  # the parent is done with this process
        return
    if said == STOP:
        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing to stop
            loop.call_soon_threadsafe(stop.set)
