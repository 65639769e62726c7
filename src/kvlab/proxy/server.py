"""The proxy's client-facing HTTP/1.1 side: parse requests, frame responses, notice goodbyes.

One `ClientConnection` per client socket parses with httptools, enforces the body limit while
the body arrives (413 before it is all read), hands each complete request to the
application, and gives it a small response API: a whole response, or a head followed by body
pieces (chunked unless the length is known) and an end. Requests pipelined behind an
unfinished one wait their turn. When the client goes away the handler task is cancelled at
once, which is how the upstream legs get closed (see `app.py`); when the client reads slower
than the engine writes, the current upstream exchange stops being read (backpressure).

Hand-written on asyncio.Protocol for the same reason as `upstream.py`: the per-request and
per-chunk budget. It deliberately does not do TLS, HTTP/2 or upgrades; a TLS-terminating
proxy belongs in front of it when it is reached from outside.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

import httptools

from kvlab.proxy.upstream import Exchange

log = logging.getLogger("kvlab.proxy")

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           405: "Method Not Allowed", 413: "Content Too Large", 500: "Internal Server Error",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
JSON = b"application/json"
REFUSED_LINGER_S = 2.0


def error_body(status: int, message: str, kind: str, **extra: Any) -> bytes:
    """An OpenAI-style error document."""
    err = {"message": message, "type": kind, "param": None, "code": status, **extra}
    return json.dumps({"error": err}).encode()


class Request:
    """One parsed client request."""

    __slots__ = ("arrived_ns", "body", "headers", "keep_alive", "method", "path")

    def __init__(self, method: bytes, path: bytes, headers: dict[bytes, bytes], body: bytes,
                 arrived_ns: int, keep_alive: bool) -> None:
        self.method, self.path, self.headers, self.body = method, path, headers, body
        self.arrived_ns, self.keep_alive = arrived_ns, keep_alive


Handler = Callable[["ClientConnection", Request], None]


class ClientConnection(asyncio.Protocol):
    """One client socket; see the module docstring."""

    def __init__(self, handler: Handler, max_body: int, registry: set[ClientConnection],
                 on_rejected: Callable[[str], None]) -> None:
        self.handler = handler
        self.max_body = max_body
        self.registry = registry
        self.on_rejected = on_rejected
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.arrived_ns = 0
        self.refused = False
        self.queue: list[Request] = []
        self.current: Request | None = None
        self.task: asyncio.Task[None] | None = None
        self.upstream: Exchange | None = None  # the exchange being relayed, for backpressure
        self.chunked = False
        self.started = False

    # asyncio callbacks -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.registry.add(self)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.refuse(400, "the request is not valid HTTP/1.1", "invalid_request_error")

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.registry.discard(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def pause_writing(self) -> None:
        up = self.upstream
        if up is not None and up.conn is not None and up.conn.transport is not None:
            up.conn.transport.pause_reading()

    def resume_writing(self) -> None:
        up = self.upstream
        if up is not None and up.conn is not None and up.conn.transport is not None:
            up.conn.transport.resume_reading()

    # httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.arrived_ns = time.perf_counter_ns()
        self.url, self.headers, self.body, self.size = b"", {}, [], 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        length = self.headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            self.refuse_too_large()
        elif self.headers.get(b"expect", b"").lower() == b"100-continue":
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s without it

    def on_body(self, body: bytes) -> None:
        if self.refused:
            return
        self.size += len(body)
        if self.size > self.max_body:
            self.refuse_too_large()
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        request = Request(self.parser.get_method(), self.url.split(b"?", 1)[0], self.headers,
                          b"".join(self.body), self.arrived_ns, self.parser.should_keep_alive())
        if self.current is None:
            self._dispatch(request)
        else:
            self.queue.append(request)
            if self.transport is not None:
                self.transport.pause_reading()

    # refusing before the handler runs ----------------------------------------------------
    def refuse_too_large(self) -> None:
        self.refuse(413, f"the request body is larger than the proxy's limit of "
                         f"{self.max_body} bytes (PROXY_MAX_BODY_BYTES)",
                    "request_too_large")

    def refuse(self, status: int, message: str, kind: str) -> None:
        self.refused = True
        self.on_rejected(kind)
        if self.current is not None:  # a response is under way on this connection
            self.abort()
            return
        self._head(status, JSON, b"", len(body := error_body(status, message, kind)),
                   keep_alive=False)
        self._write(body)
        # closing now, with the client's body still arriving, would reset the connection
        # before it reads the answer: stop sending, discard what comes, close a bit later
        tr = self.transport
        if tr is not None and tr.can_write_eof():
            tr.write_eof()
            self.loop.call_later(REFUSED_LINGER_S, self.close)
        else:
            self.close()

    # the response API --------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run the current request's handler as a task this connection can cancel."""
        self.task = self.loop.create_task(coro)
        self.task.add_done_callback(self._task_done)

    def respond(self, status: int, body: bytes, ctype: bytes = JSON, extra: bytes = b"") -> None:
        """A whole response; the connection moves on to the next request."""
        self._head(status, ctype, extra, len(body))
        self._write(body)
        self.finish()

    def start(self, status: int, ctype: bytes, extra: bytes = b"",
              length: int | None = None) -> None:
        """The head of a response whose body follows in `write` calls."""
        self.chunked = length is None
        self._head(status, ctype, extra, length)

    def write(self, data: bytes) -> None:
        tr = self.transport
        if tr is None or tr.is_closing():
            return
        if self.chunked:
            tr.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            tr.write(data)

    def end(self) -> None:
        if self.chunked:
            self._write(b"0\r\n\r\n")
        self.finish()

    def finish(self) -> None:
        """The response is complete: next request, or close."""
        request, self.current = self.current, None
        self.upstream = None
        self.started = False
        if request is None or not request.keep_alive:
            self.close()
            return
        if self.queue:
            if self.transport is not None:
                self.transport.resume_reading()
            self._dispatch(self.queue.pop(0))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # internals ---------------------------------------------------------------------------
    def _dispatch(self, request: Request) -> None:
        self.current = request
        self.task = None
        self.handler(self, request)

    def _head(self, status: int, ctype: bytes, extra: bytes, length: int | None,
              keep_alive: bool = True) -> None:
        self.started = True
        current = self.current
        keep = keep_alive and (current is None or current.keep_alive)
        framing = (b"transfer-encoding: chunked\r\n" if length is None
                   else b"content-length: %d\r\n" % length)
        self._write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s%s%s\r\n" % (
            status, REASONS.get(status, "Error").encode(), ctype, framing, extra,
            b"" if keep else b"connection: close\r\n"))

    def _write(self, data: bytes) -> None:
        tr = self.transport
        if tr is not None and not tr.is_closing():
            tr.write(data)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        log.error("proxy handler failed: %r", exc, exc_info=exc)
        if not self.started and self.open:
            self.respond(500, error_body(500, "the proxy failed on this request (a bug)",
                                         "internal_error"))
        else:
            self.abort()
