"""User sessions: conversations whose next turn waits for the previous reply and a think time.

A level of `users` users (`SessionRun`). Each user holds one keep-alive connection and runs a
conversation of `turns` turns (at most: a dataset's conversations end where theirs do): turn
t+1 is built only after turn t's reply arrived (its real text goes back as the assistant's
message, so token counts are the server's own even with random weights), then sent after a
think time (`ThinkTime`: fixed, exponential, drawn from a file of measured think times, or
paced: exponential with the mean that keeps about N of the users in flight, given one request's
time measured by the warm-up). Either the whole population is there from the start (first turns
spread over one mean think time, so the users are not in lockstep), or users arrive at
`user_rate` per second (seeded Poisson), each for one conversation. A user that finishes a
conversation takes the next while the level wants more: until `conversations` were started and,
with a duration, until it passed; a conversation that started runs its turns to the end (a
failed turn ends it). Ctrl-C cancels what is in flight (recorded as cancelled).

`returning.summary` reads the measured turns back (returning turns, evictions, the working
set). Prompts come from `workloads.session_turn`; the requests' bytes from the caller's
`build`, so this module knows no engine and no request body.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kvlab.core import InputError
from kvlab.loadgen.client import Connection, Endpoint, open_connection, request_id_of
from kvlab.loadgen.record import RequestRecord, decode_events, reply_text
from kvlab.loadgen.runner import LevelResult, Progress
from kvlab.loadgen.workloads import Prompt
from kvlab.records import ThinkTimeLine, Workload

History = tuple[tuple[str, str], ...]
# (conversation number within the level, turn, history) -> the prompt and its request bytes,
# or None when the conversation has no such turn (a dataset's conversations differ in length)
Build = Callable[[int, int, History], tuple[Prompt, bytes] | None]
ThinkKind = Literal["fixed", "exponential", "trace", "paced"]


@dataclass(frozen=True)
class ThinkTime:
    """Seconds a user waits between a reply and the next turn."""

    kind: ThinkKind
    mean_s: float
    values: tuple[float, ...] = ()  # "trace": the measured think times drawn from
    source: str = ""
    in_flight: int = 0  # "paced": the users meant to be in flight at once

    @classmethod
    def parse(cls, text: str) -> ThinkTime:
        """`2` or `fixed:2`, `exponential:2` (mean), `trace:FILE` (seconds, one a line), or
        `paced:N` (about N users in flight)."""
        kind, sep, value = text.strip().partition(":")
        if not sep:
            kind, value = "fixed", kind
        kind = {"exp": "exponential"}.get(kind, kind)
        if kind == "trace":
            return cls.from_file(Path(value))
        if kind == "paced":
            if not value.isdigit() or int(value) < 1:
                raise InputError(f"--think-time {text!r}: paced:N takes a whole number of "
                                 "users in flight, at least 1")
            return cls("paced", 0.0, in_flight=int(value))
        if kind not in ("fixed", "exponential"):
            raise InputError(f"--think-time {text!r}: use fixed:S, exponential:S, trace:FILE "
                             "or paced:N")
        try:
            seconds = float(value)
        except ValueError:
            raise InputError(f"--think-time {text!r}: {value!r} is not a number of seconds") \
                from None
        if not 0 <= seconds < math.inf:
            raise InputError(f"--think-time {text!r}: give 0 or more seconds")
        return cls(kind, seconds)  # type: ignore[arg-type]

    @classmethod
    def from_file(cls, path: Path) -> ThinkTime:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InputError(f"--think-time trace:{path}: cannot read it ({exc.strerror})") \
                from None
        values = []
        for number, raw in enumerate(lines, 1):
            text = raw.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                values.append(float(text))
            except ValueError:
                raise InputError(f"{path}:{number}: {text!r} is not a number of seconds") \
                    from None
            if not 0 <= values[-1] < math.inf:
                raise InputError(f"{path}:{number}: think times are 0 or more seconds")
        if not values:
            raise InputError(f"--think-time trace:{path}: the file holds no think times")
        return cls("trace", sum(values) / len(values), tuple(values), str(path))

    def paced_for(self, users: int, request_s: float,
                  measured: str = "the warm-up's fastest") -> ThinkTime:
        """Paced: exponential, mean request_s x (users / in_flight - 1), so that about
        `in_flight` users wait for a reply while the rest think (`measured`: how request_s was
        had)."""
        if self.kind != "paced":
            return self
        mean = request_s * max(0.0, users / self.in_flight - 1)
        return ThinkTime("exponential", mean, source=(
            f"paced: about {self.in_flight} of {users} users in flight, from a request time of "
            f"{request_s:.3f} s ({measured})"))

    def sample(self, rng: random.Random) -> float:
        if self.kind == "paced":
            raise ValueError("a paced think time is drawn once paced_for gave its mean")
        if self.kind == "exponential":
            return rng.expovariate(1 / self.mean_s) if self.mean_s > 0 else 0.0
        if self.kind == "trace":
            return self.values[rng.randrange(len(self.values))]
        return self.mean_s

    def as_record(self) -> ThinkTimeLine:
        """What a row says about the think time."""
        return ThinkTimeLine(kind=self.kind, mean_s=round(self.mean_s, 4),
                             source=self.source or None,
                             in_flight=self.in_flight if self.kind == "paced" else None,
                             values=len(self.values) if self.kind == "trace" else None)


@dataclass(frozen=True)
class SessionSpec:
    """A level's users (the level gives how many) and how they behave."""

    turns: int = 4
    think: ThinkTime = ThinkTime("fixed", 1.0)
    user_rate: float | None = None  # new users per second; None: all there from the start
    conversations: int | None = None  # conversations in all (None: one per user)
    cache_block_tokens: int | None = None  # the cache's block, for the eviction rule
    distinct_opening: bool = False  # each conversation's system line opens with its own tag

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise InputError(f"--turns {self.turns}: give at least 1")
        if self.user_rate is not None and not self.user_rate > 0:
            raise InputError(f"--user-rate {self.user_rate}: must be above 0 users a second")
        if self.conversations is not None and self.conversations < 1:
            raise InputError(f"conversations {self.conversations}: give at least 1")

    def planned(self, users: int, min_requests: int | None = None) -> int:
        """Conversations the level starts at least."""
        wanted = math.ceil(min_requests / self.turns) if min_requests else 0
        return max(self.conversations or users, wanted)

    def workload(self, users: int) -> Workload:
        return Workload(kind="sessions", users=users, turns=self.turns,
                        think_time=self.think.as_record(), user_rate=self.user_rate,
                        arrivals="poisson" if self.user_rate else "population",
                        distinct_opening=self.distinct_opening or None)


@dataclass
class SessionResult:
    level: LevelResult
    prompts: dict[int, Prompt] = field(default_factory=dict)
    peak_active_users: int = 0
    conversations_started: int = 0


class _User:
    """One user's keep-alive connection and the reply it waits for."""

    def __init__(self, run: SessionRun, number: int) -> None:
        self.run, self.number = run, number
        self.rng = random.Random(f"{run.seed}:user:{number}")
        self.conn: Connection | None = None
        self.record: RequestRecord | None = None
        self.waiting: asyncio.Future[RequestRecord] | None = None

    def on_done(self, conn: Connection, record: RequestRecord) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(record)

    async def send(self, record: RequestRecord, payload: bytes) -> RequestRecord:
        """Send one turn and wait for its end; a stale keep-alive connection is retried once
        on a fresh one."""
        for attempt in (0, 1):
            if self.conn is None or not self.conn.idle:
                try:
                    self.conn = await self.run.connect(self.on_done)
                except (OSError, TimeoutError) as exc:
                    record.sent_ns = record.end_ns = time.perf_counter_ns()
                    record.error = "connect failed"
                    record.error_detail = str(exc) or type(exc).__name__
                    return record
            self.waiting = self.run.loop.create_future()
            self.record = record
            self.conn.start(record, payload, self.run.timeout_s, self.run.loop)
            done = await self.waiting
            self.record = None
            if (attempt or done.error != "connection closed" or done.headers_ns
                    or self.conn.uses < 2):
                return done
            record = self.run.replace(done)
        return record

    def cancel(self) -> None:
        if self.record is None:
            return
        if self.conn is not None and not self.conn.idle:
            self.conn.cancel()
        else:
            self.record.cancelled = True
            self.record.end_ns = time.perf_counter_ns()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class SessionRun:
    """Drive one level of `users` users; `await run()` once."""

    def __init__(self, target: Endpoint, users: int, spec: SessionSpec, build: Build, *,
                 timeout_s: float, seed: int = 0, duration_s: float | None = None,
                 min_requests: int | None = None, connect_timeout_s: float = 10.0,
                 progress: Progress | None = None) -> None:
        self.target, self.users, self.spec, self.build = target, users, spec, build
        self.timeout_s, self.seed, self.duration_s = timeout_s, seed, duration_s
        self.planned = spec.planned(users, min_requests)
        self.connect_timeout_s, self.progress = connect_timeout_s, progress
        self.loop = asyncio.get_running_loop()
        self.records: list[RequestRecord] = []
        self.prompts: dict[int, Prompt] = {}
        self.started = self.active = self.peak = self.opened = 0
        self.deadline_ns = 0
        self.stopping = False
        self._users: list[_User] = []

    async def connect(self, on_done: Callable[[Connection, RequestRecord], None]) -> Connection:
        conn = await open_connection(self.loop, self.target, on_done, self.connect_timeout_s)
        self.opened += 1
        return conn

    def replace(self, stale: RequestRecord) -> RequestRecord:
        fresh = RequestRecord(index=stale.index, prompt_index=stale.prompt_index,
                              scheduled_ns=stale.scheduled_ns, request_id=stale.request_id)
        self.records[self.records.index(stale)] = fresh
        return fresh

    def take(self) -> int | None:
        """The next conversation to start, or None when the level wants no more."""
        if self.stopping:
            return None
        if self.started < self.planned or time.perf_counter_ns() < self.deadline_ns:
            self.started += 1
            return self.started - 1
        return None

    async def run(self, stop: asyncio.Event | None = None) -> SessionResult:
        start = time.perf_counter_ns()
        if self.duration_s:
            self.deadline_ns = start + round(self.duration_s * 1e9)
        driver = asyncio.ensure_future(self._drive())
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            await asyncio.wait({driver, *([stopper] if stopper else [])},
                               return_when=asyncio.FIRST_COMPLETED)
            if not driver.done():
                self._interrupt(driver)
            await asyncio.gather(driver, return_exceptions=True)
            if not driver.cancelled() and driver.exception() is not None:
                raise driver.exception()  # type: ignore[misc]  # a bug: surface it
        except asyncio.CancelledError:
            self._interrupt(driver)
            raise
        finally:
            if stopper is not None:
                stopper.cancel()
            for user in self._users:
                user.close()
        return self._result(start)

    def _interrupt(self, driver: asyncio.Future[None]) -> None:
        """Ctrl-C: in-flight turns are cancelled, thinking users stop."""
        self.stopping = True
        for user in self._users:
            user.cancel()
        driver.cancel()

    def _result(self, start: int) -> SessionResult:
        now = time.perf_counter_ns()
        for r in self.records:  # cut while connecting: cancelled, never sent
            if not r.end_ns:
                r.cancelled, r.end_ns = True, now
        sent = [r for r in self.records if r.sent_ns]
        ends = [r.end_ns for r in sent]
        level = LevelResult(records=sent, start_ns=start, end_ns=max(ends) if ends else start,
                            interrupted=self.stopping, unsent=len(self.records) - len(sent),
                            connections_opened=self.opened)
        return SessionResult(level, self.prompts, self.peak, self.started)

    async def _drive(self) -> None:
        """Population: every user from the start. Arrivals: a seeded Poisson process."""
        tasks: list[asyncio.Task[None]] = []
        try:
            if self.spec.user_rate is None:
                spread = random.Random(f"{self.seed}:spread")
                for u in range(self.users):
                    offset = spread.uniform(0, self.spec.think.mean_s)
                    tasks.append(asyncio.create_task(self._user(u, offset, True)))
            else:
                await self._arrivals(tasks)
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _arrivals(self, tasks: list[asyncio.Task[None]]) -> None:
        rng, start = random.Random(f"{self.seed}:arrivals"), time.perf_counter_ns()
        at, u = 0.0, 0
        assert self.spec.user_rate is not None
        while not self.stopping and (u < self.users or time.perf_counter_ns() < self.deadline_ns):
            delay = start / 1e9 + at - time.perf_counter_ns() / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._user(u, 0.0, False)))
            u += 1
            at += rng.expovariate(self.spec.user_rate)

    async def _user(self, number: int, offset_s: float, stays: bool) -> None:
        user = _User(self, number)
        self._users.append(user)
        if offset_s:
            await asyncio.sleep(offset_s)
        while (conv := self.take()) is not None:
            self.active += 1
            self.peak = max(self.peak, self.active)
            try:
                await self._conversation(user, conv)
            finally:
                self.active -= 1
            if not stays:
                return

    async def _conversation(self, user: _User, conv: int) -> None:
        history: History = ()
        for turn in range(self.spec.turns):
            if turn:
                await asyncio.sleep(self.spec.think.sample(user.rng))
            if self.stopping:
                return
            built = self.build(conv, turn, history)
            if built is None:
                return
            prompt, payload = built
            self.prompts[prompt.index] = prompt
            record = RequestRecord(index=len(self.records), prompt_index=prompt.index,
                                   scheduled_ns=time.perf_counter_ns(),
                                   request_id=request_id_of(payload))
            self.records.append(record)
            done = await user.send(record, payload)
            reply = reply_text(done)
            decode_events(done)
            if self.progress is not None:
                self.progress(done)
            if not done.ok:
                return
            history = (*history, prompt.messages[-1], ("assistant", reply))
