"""One level of load: N requests at a concurrency, closed-loop or on an open-loop schedule.

Closed loop (no rate): `concurrency` requests start together and each completion releases the
next one at once, the way the seed's generator works. Open loop (`rate` requests per second, or
a trace's own arrival times, `arrivals_ns`): arrivals follow a seeded schedule (gamma gaps of
shape `burstiness` and mean 1/rate, as vllm bench serve draws them: 1 is Poisson, below 1
burstier, infinity evenly spaced) or the trace's, whatever the server does, capped
at `concurrency` in flight; a request that arrives while the cap is reached waits, and that wait
shows as scheduling lag. Lag (send stamp minus scheduled stamp) is recorded for every request,
so a client that cannot keep up is visible in the data instead of hiding in the server's times.

A closed-loop level can also run for a time (`Until`): it keeps releasing requests until at
least `min_count` were sent and `duration_s` has passed since its start, then lets the ones in
flight finish; an open-loop level is given its count up front (`Schedule.within`). A timed level
prebuilds what it expects to need; past that, `Until.more` builds one request at a time between
responses (its cost shows as scheduling lag, and the count in `built_during`).

Everything runs from loop callbacks (no task per request). A stop event (Ctrl-C) cancels what
is in flight, records those requests as cancelled and drops the ones never sent; the records
measured so far are returned. Statistics live in `stats`; this module only produces records.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvlab.core import UnreachableError
from kvlab.loadgen.client import Connection, Endpoint, open_connection, request_id_of
from kvlab.loadgen.record import RequestRecord

Progress = Callable[[RequestRecord], None]
_TIMER_RESOLUTION_S = 0.001


@dataclass(frozen=True)
class Schedule:
    """How requests are released: closed loop when neither `rate` nor `arrivals_ns` is given."""

    concurrency: int
    rate: float | None = None  # requests per second, open loop
    burstiness: float = 1.0  # open loop: the gaps' gamma shape (1 Poisson, inf even spacing)
    seed: int = 0
    arrivals_ns: tuple[int, ...] = ()  # open loop at these offsets (a trace's), not a rate

    @property
    def open_loop(self) -> bool:
        return self.rate is not None or bool(self.arrivals_ns)

    def offsets_ns(self, count: int) -> list[int]:
        """Arrival offsets from the level start, seeded so a run can be repeated exactly."""
        if self.arrivals_ns:
            return list(self.arrivals_ns[:count]) + [self.arrivals_ns[-1]] * max(
                0, count - len(self.arrivals_ns))
        if self.rate is None:
            return [0] * count
        if math.isinf(self.burstiness):
            return [round(i * 1e9 / self.rate) for i in range(count)]
        rng = random.Random(self.seed)
        out, t = [], 0.0
        for _ in range(count):
            out.append(round(t * 1e9))
            t += self._gap(rng)
        return out

    def _gap(self, rng: random.Random) -> float:
        """One gap: gamma with shape `burstiness` and mean 1/rate, as vllm bench serve draws
        them (shape 1 is the exponential, drawn as before so seeded schedules stay put)."""
        assert self.rate is not None
        if self.burstiness == 1.0:
            return rng.expovariate(self.rate)
        return rng.gammavariate(self.burstiness, 1.0 / (self.rate * self.burstiness))

    def within(self, duration_s: float, limit: int) -> int:
        """Open loop: how many arrivals of this seeded schedule fall within `duration_s` of
        the start (at most `limit`)."""
        return bisect.bisect_left(self.offsets_ns(limit), duration_s * 1e9)


@dataclass(frozen=True)
class Until:
    """A closed-loop level that runs for a time: at least `min_count` requests sent and
    `duration_s` seconds passed, whichever comes later. `more(i)` builds request i when the
    prebuilt ones run out first (None: the level ends there, `exhausted`); `limit` caps the
    requests of the level."""

    min_count: int
    duration_s: float = 0.0
    more: Callable[[int], tuple[int, bytes]] | None = None
    limit: int | None = None


@dataclass
class LevelResult:
    """The records of one level (request order), its wall-clock span, and whether it was cut."""

    records: list[RequestRecord]
    start_ns: int
    end_ns: int
    interrupted: bool = False
    unsent: int = 0
    connections_opened: int = 0
    retried: list[int] = field(default_factory=list)
    exhausted: bool = False  # a timed level ran out of requests before its time
    built_during: int = 0  # a timed level's requests built while it ran (`Until.more`)
    cut_at_max_s: bool = False  # --max-seconds passed before every request was sent


class LevelRun:
    """Drive one level; `await run()` once."""

    def __init__(self, target: Endpoint, payloads: Sequence[tuple[int, bytes]], schedule: Schedule,
                 *, timeout_s: float, connect_timeout_s: float = 10.0,
                 progress: Progress | None = None, until: Until | None = None,
                 max_s: float | None = None) -> None:
        self._target = target
        self._max_s = max_s  # no request sent after this many seconds (in flight: finish)
        self._cut = False
        self._payloads = list(payloads)  # a timed level may add to it
        self._built = 0
        self._exhausted = False
        self._schedule = schedule
        self._until = None if schedule.open_loop else until  # open loop: count given
        self._until_ns = 0
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._progress = progress
        self._loop = asyncio.get_running_loop()
        self._records: list[RequestRecord] = []
        self._queue: deque[RequestRecord] = deque()
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()
        self._connecting: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._next = 0
        self._done = 0
        self._opened = 0
        self._retried: list[int] = []
        self._stopping = False
        self._offsets: list[int] = []
        self._start_ns = 0
        self._ticker: asyncio.TimerHandle | None = None
        self._finished: asyncio.Future[None] = self._loop.create_future()
        self._warmed = False

    async def warm(self) -> None:
        """Open the first connections (`run` does it unless done already)."""
        if not self._warmed:
            self._warmed = True
            await self._warm(min(self._schedule.concurrency, len(self._payloads)))

    async def run(self, stop: asyncio.Event | None = None,
                  start_ns: int | None = None) -> LevelResult:
        """Run the level; `start_ns`, a `perf_counter_ns` stamp (CLOCK_MONOTONIC, the same in
        every process of the machine): the schedule's start, waited for after warming (the
        processes of one spread level share it)."""
        count = len(self._payloads)
        await self.warm()
        if start_ns is not None:
            await asyncio.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
        # A full cyclic-GC pass over tens of thousands of live records stalls the loop for
        # milliseconds, which would show as timing error; nothing here makes cycles, so the
        # collector waits until the level is over.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        self._offsets = self._schedule.offsets_ns(count)
        self._start_ns = start_ns if start_ns is not None else time.perf_counter_ns()
        if self._until is not None:
            self._until_ns = self._start_ns + round(self._until.duration_s * 1e9)
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        cutter = self._loop.call_later(self._max_s, self._time_up) \
            if self._max_s is not None else None
        try:
            if count == 0:
                self._finished.set_result(None)
            elif not self._schedule.open_loop:
                for _ in range(min(self._schedule.concurrency, count)):
                    self._release(self._start_ns)
                self._pump()
            else:
                self._tick()
            waiters: set[asyncio.Future[object]] = {self._finished}  # type: ignore[arg-type]
            if stopper is not None:
                waiters.add(stopper)  # type: ignore[arg-type]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if not self._finished.done():
                self._interrupt()
                if self._connecting:
                    await asyncio.wait(set(self._connecting))
        except asyncio.CancelledError:
            self._interrupt()
            raise
        finally:
            if gc_was_enabled:
                gc.enable()
            if stopper is not None:
                stopper.cancel()
            if cutter is not None:
                cutter.cancel()
            self._close_all()
        return self._result()

    def _time_up(self) -> None:
        """`max_s` passed: nothing more is sent; what is in flight finishes and the level
        ends with it (the rest counted unsent)."""
        self._cut = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._drop_queued()
        self._next = len(self._payloads)
        if self._in_flight == 0 and not self._finished.done():
            self._finished.set_result(None)

    # --- release and send -------------------------------------------------------------
    def _release(self, scheduled_ns: int) -> None:
        prompt_index, _ = self._payloads[self._next]
        record = RequestRecord(index=self._next, prompt_index=prompt_index,
                               scheduled_ns=scheduled_ns)
        self._records.append(record)
        self._queue.append(record)
        self._next += 1

    def _tick(self) -> None:
        self._ticker = None
        if self._stopping:
            return
        now = time.perf_counter_ns()
        count = len(self._payloads)
        while self._next < count and self._start_ns + self._offsets[self._next] <= now:
            self._release(self._start_ns + self._offsets[self._next])
        self._pump()
        if self._next < count:
            delay = (self._start_ns + self._offsets[self._next] - time.perf_counter_ns()) / 1e9
            # uvloop's timers tick in whole milliseconds: a shorter delay fires on the next
            # loop pass and would spin; arriving up to 1 ms late shows as scheduling lag
            self._ticker = self._loop.call_later(max(delay, _TIMER_RESOLUTION_S), self._tick)

    def _pump(self) -> None:
        while self._queue and self._in_flight < self._schedule.concurrency and not self._stopping:
            record = self._queue.popleft()
            self._in_flight += 1
            self._send(record)

    def _send(self, record: RequestRecord) -> None:
        payload = self._payloads[record.index][1]
        while self._idle:
            conn = self._idle.pop()
            if conn.idle:
                self._busy.add(conn)
                conn.start(record, payload, self._timeout_s, self._loop)
                return
        task = self._loop.create_task(self._connect_and_send(record, payload))
        self._connecting.add(task)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[None]) -> None:
        self._connecting.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None and not self._finished.done():
            self._finished.set_exception(error)  # a bug: surface it, never hang

    async def _connect_and_send(self, record: RequestRecord, payload: bytes) -> None:
        try:
            conn = await open_connection(self._loop, self._target, self._on_done,
                                         self._connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            record.sent_ns = record.end_ns = time.perf_counter_ns()
            record.error, record.error_detail = "connect failed", str(exc) or type(exc).__name__
            self._on_done(None, record)
            return
        except asyncio.CancelledError:
            record.cancelled = True
            record.end_ns = time.perf_counter_ns()
            self._on_done(None, record)
            raise
        self._opened += 1
        if self._stopping:
            conn.close()
            record.cancelled = True
            record.end_ns = time.perf_counter_ns()
            self._on_done(None, record)
            return
        self._busy.add(conn)
        conn.start(record, payload, self._timeout_s, self._loop)

    # --- completion ---------------------------------------------------------------------
    def _on_done(self, conn: Connection | None, record: RequestRecord) -> None:
        if conn is not None:
            self._busy.discard(conn)
            if conn.usable and not self._stopping:
                self._idle.append(conn)
            else:
                conn.close()
            if self._stale_keepalive(conn, record):
                return
        self._in_flight -= 1
        self._done += 1
        if self._progress is not None:
            self._progress(record)
        if self._stopping:
            return
        now = time.perf_counter_ns()  # before `_wanted` builds anything: its cost is lag
        if not self._schedule.open_loop and self._wanted():
            self._release(now)
        self._pump()
        if self._in_flight == 0 and not self._queue and not self._finished.done() and (
                self._next == len(self._payloads) or not self._schedule.open_loop or self._cut):
            self._finished.set_result(None)

    def _wanted(self) -> bool:
        """Closed loop: whether another request should be released now."""
        if self._cut:
            return False
        until = self._until
        if until is None:
            return self._next < len(self._payloads)
        if self._next < until.min_count:
            return self._next < len(self._payloads)
        if time.perf_counter_ns() >= self._until_ns:
            return False
        if self._next == len(self._payloads):
            if until.more is None or self._next == until.limit:
                self._exhausted = True
                return False
            self._payloads.append(until.more(self._next))
            self._built += 1
        return True

    def _stale_keepalive(self, conn: Connection, record: RequestRecord) -> bool:
        """A reused connection the server had already closed: resend once on a fresh one."""
        if (record.error != "connection closed" or record.headers_ns or conn.uses < 2
                or record.index in self._retried or self._stopping):
            return False
        self._retried.append(record.index)
        scheduled = record.scheduled_ns
        fresh = RequestRecord(index=record.index, prompt_index=record.prompt_index,
                              scheduled_ns=scheduled)
        self._records[self._records.index(record)] = fresh
        self._in_flight -= 1
        self._queue.appendleft(fresh)
        self._pump()
        return True

    # --- stop ----------------------------------------------------------------------------
    async def _warm(self, count: int) -> None:
        """Open the first connections before the clock starts; an unreachable server stops here."""
        if count == 0:
            return
        try:
            conns = await asyncio.gather(*(
                open_connection(self._loop, self._target, self._on_done, self._connect_timeout_s)
                for _ in range(count)))
        except (OSError, TimeoutError) as exc:
            raise UnreachableError(
                f"cannot connect to {self._target.host}:{self._target.port} ({exc or 'timeout'}); "
                "is the server running at --base-url?") from None
        self._opened += len(conns)
        self._idle.extend(conns)

    def _interrupt(self) -> None:
        self._stopping = True
        if self._ticker is not None:
            self._ticker.cancel()
        for conn in list(self._busy):
            conn.cancel()
        for task in list(self._connecting):
            task.cancel()
        self._drop_queued()

    def _drop_queued(self) -> None:
        """Released requests not sent yet are no records: the result counts them unsent."""
        unsent = {id(r) for r in self._queue}
        self._records = [r for r in self._records if id(r) not in unsent]
        self._queue.clear()

    def _close_all(self) -> None:
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()

    def _result(self) -> LevelResult:
        for r in self._records:  # read after the level: nothing added while it runs
            r.request_id = request_id_of(self._payloads[r.index][1])
        ends = [r.end_ns for r in self._records if r.end_ns]
        sent = len(self._records)
        planned = len(self._payloads) if self._until is None else self._until.min_count
        return LevelResult(
            records=sorted(self._records, key=lambda r: r.index),
            start_ns=self._start_ns,
            end_ns=max(ends) if ends else self._start_ns,
            interrupted=self._stopping,
            unsent=max(0, planned - sent),
            connections_opened=self._opened,
            retried=list(self._retried),
            exhausted=self._exhausted,
            built_during=self._built,
            cut_at_max_s=self._cut,
        )
