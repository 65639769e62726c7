"""The proxy's client-facing HTTP/1.1 side: parse requests, frame responses, notice goodbyes.

One `ClientConnection` per client socket parses with httptools and hands each complete
request to the application, with a small response API: a whole response, or a head followed
by body pieces (chunked unless the length is known; an HTTP/1.0 client gets the body ended by
the connection's close instead) and an end. Requests pipelined behind an unfinished one wait
their turn; so does a refusal of a bad one (the good answers go out first).

Limits (`limits.py`) hold before the parser sees the bytes: the head is metered as it
arrives (414, 431, 400), the body while it arrives (413). Each connection keeps a deadline
that `Front` (`front.py`) sweeps: a head must arrive within PROXY_HEAD_TIMEOUT_S (408), an
idle keep-alive connection closes after PROXY_KEEPALIVE_TIMEOUT_S, a client that leaves a
response unread past PROXY_CLIENT_STALL_TIMEOUT_S is cut off (a slow client, not a decode
failure: while the client is not reading, decode is not read either and its silence timer
waits). Past PROXY_MAX_CONNECTIONS a new connection gets a 503 at once.

When the client goes away the handler task is cancelled at once, which is how the upstream
legs get closed (see `app.py`). Hand-written on asyncio.Protocol for the same reason as
`upstream.py`: the per-request and per-chunk budget. It deliberately does not do TLS, HTTP/2,
upgrades or CONNECT (refused with 400 / 405); a TLS-terminating proxy belongs in front of it
when it is reached from outside.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, cast

import httptools

from kvlab.proxy.limits import HeadMeter, Refusal, too_many_headers
from kvlab.proxy.upstream import Exchange

if TYPE_CHECKING:
    from kvlab.proxy.limits import ClientLimits
    from kvlab.proxy.metrics import ProxyMetrics

log = logging.getLogger("kvlab.proxy")

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 413: "Content Too Large",
           414: "URI Too Long", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}
JSON = b"application/json"
REFUSED_LINGER_S = 2.0


def error_body(status: int, message: str, kind: str, **extra: object) -> bytes:
    """An OpenAI-style error document."""
    err = {"message": message, "type": kind, "param": None, "code": status, **extra}
    return json.dumps({"error": err}).encode()


class Request:
    """One parsed client request."""

    __slots__ = ("arrived_ns", "body", "headers", "http10", "keep_alive", "method", "path")

    def __init__(self, method: bytes, path: bytes, headers: dict[bytes, bytes], body: bytes,
                 arrived_ns: int, keep_alive: bool, http10: bool = False) -> None:
        self.method, self.path, self.headers, self.body = method, path, headers, body
        self.arrived_ns, self.keep_alive, self.http10 = arrived_ns, keep_alive, http10


Handler = Callable[["ClientConnection", Request], None]


class Front(Protocol):
    """What a connection asks of the proxy's front (`front.Front`): the handler, the limits
    and the connection cap, the open connections, and where to count what happened."""

    handler: Handler
    limits: ClientLimits
    metrics: ProxyMetrics
    cap: int
    connections: set[ClientConnection]

    def rejected(self, kind: str) -> None: ...

    def timed_out(self, phase: str) -> None: ...

    def over_cap(self) -> None: ...

    def failed(self, exc: BaseException) -> None: ...


class ClientConnection(asyncio.Protocol):
    """One client socket; see the module docstring."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.limits = front.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.meter = HeadMeter(front.limits)
        self.in_head = True  # the parser expects a request line or headers next
        self.body_left: int | None = None  # of a body framed by content-length
        self.upgrade = False
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.n_headers = 0
        self.body: list[bytes] = []
        self.size = 0
        self.arrived_ns = 0
        self.refused = False
        self.queue: list[Request | Refusal] = []
        self.current: Request | None = None
        self.task: asyncio.Task[None] | None = None
        self.upstream: Exchange | None = None  # the exchange being relayed, for backpressure
        self.framing = "length"  # of the response under way: length, chunked or close
        self.started = False
        self.phase = "new"  # new, head, body, busy (a request is handled), idle (keep-alive)
        self.deadline: float | None = None
        self.paused_at: float | None = None  # since when the client has not been reading
        self.slow = False  # cut off for not reading

    # asyncio callbacks -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        front = self.front
        if len(front.connections) >= front.cap:
            self.refused = True
            front.over_cap()
            body = error_body(503, f"the proxy holds its limit of {front.cap} client "
                                   "connections (PROXY_MAX_CONNECTIONS); retry shortly",
                              "overloaded")
            self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: %s\r\n"
                                 b"content-length: %d\r\nretry-after: 1\r\nconnection: close"
                                 b"\r\n\r\n%s" % (JSON, len(body), body))
            self.transport.close()
            return
        front.connections.add(self)
        front.metrics.clients.inc()
        self.deadline = self.loop.time() + self.limits.head_timeout_s

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.current is None:
            self._reading()
        while data and not self.refused:
            if not self.in_head:
                n = self.body_left or len(data)  # a body framed by length ends exactly
            else:
                if not self.meter.used:
                    data = data.lstrip(b"\r\n")  # empty lines between requests
                    if not data:
                        return
                n, refusal = self.meter.take(data)
                if refusal is not None:
                    if n:
                        self._feed(data[:n])
                    self.refuse(refusal)
                    return
            piece, data = (data, b"") if n >= len(data) else (data[:n], data[n:])
            self._feed(piece)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self in self.front.connections:
            self.front.connections.discard(self)
            self.front.metrics.clients.dec()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def pause_writing(self) -> None:
        self.paused_at = self.loop.time()
        if self.upstream is not None:
            self.upstream.hold()

    def resume_writing(self) -> None:
        self.paused_at = None
        if self.upstream is not None:
            self.upstream.unhold()

    # httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.arrived_ns = time.perf_counter_ns()
        self.url, self.headers, self.body, self.size, self.n_headers = b"", {}, [], 0, 0

    def on_url(self, url: bytes) -> None:
        self.url += url  # its length is bounded by the head meter

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.refused:
            return
        self.n_headers += 1
        if self.n_headers > self.limits.max_headers:
            self.refuse(too_many_headers(self.limits))
        else:
            self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.meter.reset()
        if self.refused:
            return
        self.upgrade = self.parser.should_upgrade()
        length = self.headers.get(b"content-length")
        self.body_left = int(length) if length is not None and length.isdigit() else None
        if self.body_left is not None and self.body_left > self.limits.max_body_bytes:
            self.refuse(self._too_large())
            return
        if self.current is not None:
            return  # pipelined behind a request in progress: nothing may be written now
        self.phase = "body"
        self.deadline = self.loop.time() + self.limits.head_timeout_s
        if (self.headers.get(b"expect", b"").lower() == b"100-continue"
                and self.parser.get_http_version() != "1.0"):
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s without it

    def on_body(self, body: bytes) -> None:
        if self.refused:
            return
        self.size += len(body)
        if self.body_left is not None:
            self.body_left -= len(body)
        if self.size > self.limits.max_body_bytes:
            self.refuse(self._too_large())
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_head = True
        tr = self.transport
        if self.refused or tr is None or tr.is_closing():  # closed earlier in this read
            return
        parser = self.parser
        if self.upgrade:
            self.refuse(_no_upgrade(parser.get_method()))
            return
        request = Request(parser.get_method(), self.url.split(b"?", 1)[0], self.headers,
                          b"".join(self.body), self.arrived_ns, parser.should_keep_alive(),
                          parser.get_http_version() == "1.0")
        if self.current is None:
            self._dispatch(request)
        else:
            self.queue.append(request)
            if self.transport is not None:
                self.transport.pause_reading()

    # refusing before the handler runs, and deadlines --------------------------------------
    def _too_large(self) -> Refusal:
        return Refusal(413, f"the request body is larger than the proxy's limit of "
                            f"{self.limits.max_body_bytes} bytes (PROXY_MAX_BODY_BYTES)",
                       "request_too_large")

    def refuse(self, refusal: Refusal) -> None:
        """Answer `refusal` (after any responses still owed on this connection) and close."""
        if self.refused:
            return
        self.refused = True
        self.deadline = None
        self.front.rejected(refusal.kind)
        if self.current is not None:
            self.queue.append(refusal)
            if self.transport is not None:
                self.transport.pause_reading()
            return
        self._send_refusal(refusal)

    def _send_refusal(self, refusal: Refusal) -> None:
        body = error_body(refusal.status, refusal.message, refusal.kind)
        self.framing = "length"
        self._head(refusal.status, JSON, refusal.extra, len(body), keep_alive=False)
        self._write(body)
        self._linger()

    def _linger(self) -> None:
        """Close after the last answer without resetting it away: closing a socket with the
        client's bytes unread sends a reset, which can destroy the answer before the client
        reads it. So: end our side, read and drop what still comes, close a bit later (or
        when the client closes)."""
        self.refused = True
        tr = self.transport
        if tr is not None and not tr.is_closing() and tr.can_write_eof():
            tr.write_eof()
            tr.resume_reading()
            self.loop.call_later(REFUSED_LINGER_S, self.close)
        else:
            self.close()

    def _reading(self) -> None:
        """Bytes arrived while no request is being handled: the read deadlines."""
        if self.phase == "idle":
            self.phase = "head"
            self.deadline = self.loop.time() + self.limits.head_timeout_s
        elif self.phase == "body":
            self.deadline = self.loop.time() + self.limits.head_timeout_s
        elif self.phase == "new":
            self.phase = "head"  # the deadline runs from the connection's opening

    def expire(self) -> None:
        """A deadline passed: close an idle connection, answer 408 to a partial request."""
        phase, self.deadline = self.phase, None
        if phase in ("new", "idle"):
            self.front.timed_out("head" if phase == "new" else "idle")
            self.close()
            return
        self.front.timed_out(phase)
        self.refuse(Refusal(408, f"the request did not arrive within "
                                 f"{self.limits.head_timeout_s:g} s (PROXY_HEAD_TIMEOUT_S)",
                            "request_timeout"))

    def stalled(self) -> None:
        """The client has left the response unread too long: cut it off (a slow client)."""
        self.paused_at = None
        self.slow = True
        self.front.timed_out("write")
        self.abort()

    # the response API --------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    @property
    def can_append(self) -> bool:
        """Whether more bytes may follow the body sent so far (not framed by a length)."""
        return self.framing != "length"

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run the current request's handler as a task this connection can cancel."""
        self.task = self.loop.create_task(coro)
        self.task.add_done_callback(self._task_done)

    def relay(self, exchange: Exchange) -> None:
        """The upstream exchange whose body is being written: held while the client lags."""
        self.upstream = exchange
        if self.paused_at is not None:
            exchange.hold()

    def respond(self, status: int, body: bytes, ctype: bytes = JSON, extra: bytes = b"") -> None:
        """A whole response; the connection moves on to the next request."""
        self.framing = "length"
        self._head(status, ctype, extra, len(body))
        self._write(body)
        self.finish()

    def start(self, status: int, ctype: bytes, extra: bytes = b"",
              length: int | None = None) -> None:
        """The head of a response whose body follows in `write` calls."""
        current = self.current
        if length is not None:
            self.framing = "length"
        elif current is not None and current.http10:
            self.framing = "close"  # HTTP/1.0 has no chunked coding
        else:
            self.framing = "chunked"
        self._head(status, ctype, extra, length)

    def write(self, data: bytes) -> None:
        tr = self.transport
        if tr is None or tr.is_closing():
            return
        if self.framing == "chunked":
            tr.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            tr.write(data)

    def end(self, last: bytes = b"") -> None:
        """End the body, `last` its final piece (one write with the chunked terminator)."""
        if self.framing == "chunked":
            self._write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last) if last
                        else b"0\r\n\r\n")
        elif last:
            self._write(last)
        self.finish()

    def finish(self) -> None:
        """The response is complete: next request (or refusal), or close."""
        request, self.current = self.current, None
        self.upstream = None
        self.started = False
        close = request is None or not request.keep_alive or self.framing == "close"
        self.framing = "length"
        if close:
            self._linger()
        elif self.queue:
            following = self.queue.pop(0)
            if isinstance(following, Refusal):
                self._send_refusal(following)
                return
            if self.transport is not None:
                self.transport.resume_reading()
            self._dispatch(following)
        else:
            self._await_next()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # internals ---------------------------------------------------------------------------
    def _feed(self, piece: bytes) -> None:
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            pass  # refused in on_message_complete; nothing after it is parsed
        except httptools.HttpParserCallbackError as exc:
            self.refused = True  # the parser stopped in error: nothing more can be read
            self._bug(exc.__context__ or exc)
        except httptools.HttpParserError:
            self.refuse(Refusal(400, "the request is not valid HTTP/1.1",
                                "invalid_request_error"))

    def _dispatch(self, request: Request) -> None:
        self.current = request
        self.task = None
        self.phase, self.deadline = "busy", None
        self.handler(self, request)

    @property
    def handler(self) -> Handler:
        return self.front.handler

    def _await_next(self) -> None:
        now = self.loop.time()
        if self.in_head and not self.meter.used:
            self.phase, self.deadline = "idle", now + self.limits.keepalive_timeout_s
        else:  # part of a pipelined request has arrived already
            self.phase = "head" if self.in_head else "body"
            self.deadline = now + self.limits.head_timeout_s

    def _head(self, status: int, ctype: bytes, extra: bytes, length: int | None,
              keep_alive: bool = True) -> None:
        self.started = True
        current = self.current
        keep = (keep_alive and self.framing != "close"
                and (current is None or current.keep_alive))
        if length is not None:
            framing = b"content-length: %d\r\n" % length
        else:
            framing = b"transfer-encoding: chunked\r\n" if self.framing == "chunked" else b""
        if not keep:
            connection = b"connection: close\r\n"
        else:
            connection = b"connection: keep-alive\r\n" if current and current.http10 else b""
        self._write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s%s%s\r\n" % (
            status, REASONS.get(status, "Error").encode(), ctype, framing, extra, connection))

    def _write(self, data: bytes) -> None:
        tr = self.transport
        if tr is not None and not tr.is_closing():
            tr.write(data)

    def _bug(self, exc: BaseException) -> None:
        self.front.failed(exc)
        if not self.started and self.open:
            self.respond(500, error_body(500, "the proxy failed on this request (a bug)",
                                         "internal_error"))
        else:
            self.abort()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._bug(exc)


def _no_upgrade(method: bytes) -> Refusal:
    if method == b"CONNECT":
        return Refusal(405, "the proxy does not tunnel: CONNECT is not supported",
                       "method_not_allowed", b"allow: GET, POST\r\n")
    return Refusal(400, "the proxy does not switch protocols: send the request without "
                        "Upgrade", "invalid_request_error")
