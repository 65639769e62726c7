"""The proxy's HTTP/1.1 client to its engines: a keep-alive pool per engine, raw bytes out.

Each `Origin` (one engine URL) keeps idle connections for reuse; an `Exchange` is one request
and its response on one connection. A buffered exchange collects the whole body (the prefill
leg); a streamed one hands every body piece to a sink as it arrives (the decode leg), from
the socket callback itself, so a token costs one parse and one write, with no task, future
or queue per chunk. Timeouts: connect, then either a deadline for the whole answer
(buffered) or a limit on silence between reads (streamed).

Hand-written on asyncio.Protocol + httptools rather than aiohttp/httpx because the proxy's
targets (under 1.5 ms of CPU per request, 22k streamed chunks/s on two cores) leave no room
for an async-iterator step per chunk; httptools does the parsing. What it deliberately does
not do: TLS, HTTP/2, redirects, proxies from the environment, retries of anything an engine
may have started (a POST is resent only when a reused idle connection turned out closed
before any byte came back).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal, cast
from urllib.parse import urlsplit

import httptools

from kvlab.core import SettingError

Kind = Literal["unavailable", "timeout", "closed", "protocol"]
IDLE_KEEP_S = 3.0  # under uvicorn's (so vLLM's) 5 s keep-alive: we close first, no races
MAX_IDLE_PER_ORIGIN = 1024


class UpstreamError(Exception):
    """A leg failed: could not connect, timed out, closed early, or spoke broken HTTP."""

    def __init__(self, kind: Kind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_url(url: str) -> tuple[str, int, str]:
    """(host, port, normalised URL) from `host:port` or `http://host:port[/v1]`."""
    raw = url.strip()
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    if parts.scheme != "http":
        raise SettingError(f"{url}: only http:// engine URLs are supported (no TLS to legs)")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise SettingError(f"{url}: give an engine as host:port or http://host:port")
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return host, port, f"http://{shown}:{port}"


def request_head(method: bytes, path: bytes, host: bytes, length: int,
                 extra: bytes = b"") -> bytes:
    """A request line and headers; `extra` is pre-rendered `name: value\\r\\n` lines."""
    return (b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%s\r\n" % (method, path, host, length, extra))


class Exchange:
    """One request/response on one upstream connection."""

    __slots__ = ("_pending", "conn", "deadline_s", "done", "first_body_ns", "head",
                 "headers", "held", "idle", "last", "received", "sink", "status", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float, idle: bool) -> None:
        self.head: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self._pending: list[bytes] = []
        self.sink: Callable[[bytes], None] | None = None
        self.received = 0
        self.first_body_ns = 0
        self.conn: Connection | None = None
        self.deadline_s = timeout_s
        self.idle = idle  # True: timeout_s is the longest silence; False: the whole answer
        self.held = False  # not read while the client is not reading (backpressure)
        self.last = loop.time()
        self.timer: asyncio.TimerHandle | None = loop.call_at(self.last + timeout_s, self._tick)

    def attach(self, sink: Callable[[bytes], None]) -> None:
        """Send body pieces to `sink` from now on, starting with any already received."""
        pending, self._pending = self._pending, []
        self.sink = sink
        for piece in pending:
            current = self.sink  # a sink may hand over to another after its first piece
            assert current is not None
            current(piece)

    def body(self) -> bytes:
        return b"".join(self._pending)

    def feed(self, piece: bytes) -> None:
        if not self.received:
            self.first_body_ns = time.perf_counter_ns()
        self.received += len(piece)
        if self.sink is not None:
            self.sink(piece)
        else:
            self._pending.append(piece)

    def hold(self) -> None:
        """The client is not reading: stop reading the engine, and stop timing its silence
        (the wait is the client's, not the engine's; the client's own stall timer runs)."""
        self.held = True
        conn = self.conn
        if conn is not None and conn.alive:
            assert conn.transport is not None
            conn.transport.pause_reading()

    def unhold(self) -> None:
        self.held = False
        conn = self.conn
        if conn is not None:
            self.last = conn.loop.time()
            if conn.alive:
                assert conn.transport is not None
                conn.transport.resume_reading()

    def _tick(self) -> None:
        self.timer = None
        if self.done.done():
            return
        conn = self.conn
        if self.idle and conn is not None:
            now = conn.loop.time()
            if self.held:
                self.last = now
            quiet_until = self.last + self.deadline_s
            if quiet_until > now:
                self.timer = conn.loop.call_at(quiet_until, self._tick)
                return
        what = "no data for" if self.idle else "no complete answer within"
        self.fail(UpstreamError("timeout", f"{what} {self.deadline_s:g} s"))

    def fail(self, error: UpstreamError) -> None:
        self._stop_timer()
        for fut in (self.head, self.done):
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # retrieved here: the waiter may already be gone
        if self.conn is not None:
            self.conn.drop()

    def finish(self) -> None:
        self._stop_timer()
        if not self.head.done():
            self.head.set_result(None)
        if not self.done.done():
            self.done.set_result(None)

    def abort(self) -> None:
        """Stop now: close the connection (the engine sees it at once), wake no one."""
        self._stop_timer()
        for fut in (self.head, self.done):
            if not fut.done():
                fut.cancel()
        if self.conn is not None:
            self.conn.drop()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one exchange at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.idle_since = 0.0
        self.framed = False

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:
            self.drop()  # an engine talking out of turn: this connection cannot be trusted
            return
        ex.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            ex.fail(UpstreamError("protocol", f"malformed HTTP from the engine: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.origin.forget(self)
        ex, self.exchange = self.exchange, None
        if ex is None:
            return
        if ex.head.done() and not self.framed and not ex.done.done():
            ex.finish()  # a body delimited by the connection's end
            return
        got = f"after {ex.received} body bytes" if ex.head.done() else "before answering"
        ex.fail(UpstreamError("closed", f"the engine closed the connection {got}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.exchange is not None
        self.exchange.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        ex = self.exchange
        assert ex is not None
        ex.status = self.parser.get_status_code()
        h = ex.headers
        self.framed = b"content-length" in h or b"chunked" in h.get(b"transfer-encoding", b"")
        if not ex.head.done():
            ex.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        assert self.exchange is not None
        self.exchange.feed(body)

    def on_message_complete(self) -> None:
        ex, self.exchange = self.exchange, None
        keep = self.parser.should_keep_alive()
        if ex is not None:
            ex.conn = None
            ex.finish()
        if keep and self.transport is not None and not self.transport.is_closing():
            self.origin.release(self)
        else:
            self.drop()

    # used by Origin and Exchange
    def send(self, ex: Exchange, data: bytes) -> None:
        assert self.transport is not None
        self.exchange = ex
        ex.conn = self
        self.transport.write(data)

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    @property
    def alive(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()


class Origin:
    """One engine (scheme-less host:port) with its pool of idle connections."""

    def __init__(self, url: str, connect_timeout_s: float) -> None:
        self.host, self.port, self.url = parse_url(url)
        self.host_header = f"{self.host}:{self.port}".encode()
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[Connection] = []
        self.busy: set[Connection] = set()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: Connection(self), self.host,
                                                        self.port)
        except TimeoutError:
            raise UpstreamError("timeout", f"no connection within {self.connect_timeout_s:g} s"
                                ) from None
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise UpstreamError("unavailable", reason.lower()) from None
        return proto

    def _reuse(self) -> Connection | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if conn.alive and now - conn.idle_since < IDLE_KEEP_S:
                return conn
            conn.drop()
        return None

    async def exchange(self, data: bytes, *, timeout_s: float, stream: bool) -> Exchange:
        """Send one request; return once the answer is complete (or, `stream`, has begun).

        A cancelled caller aborts the exchange (the engine sees the connection close).
        """
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = self._reuse()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            self.busy.add(conn)
            ex = Exchange(loop, timeout_s, idle=stream)
            conn.send(ex, data)
            try:
                await (ex.head if stream else ex.done)
            except UpstreamError as err:
                if reused and attempt == 0 and err.kind == "closed" and not ex.head.done():
                    continue  # the idle connection had been closed by the engine
                raise
            except BaseException:
                ex.abort()
                raise
            return ex
        raise AssertionError("unreachable")  # pragma: no cover

    def release(self, conn: Connection) -> None:
        self.busy.discard(conn)
        if len(self.idle) >= MAX_IDLE_PER_ORIGIN:
            conn.drop()
            return
        transport = conn.transport
        if transport is not None and not transport.is_reading():
            transport.resume_reading()  # held for a slow client when the answer ended
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self.busy.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        """Drop every connection, idle or busy (shutdown)."""
        for conn in [*self.idle, *self.busy]:
            conn.drop()
        self.idle.clear()
        self.busy.clear()
