"""A raw streaming HTTP/1.1 client: one asyncio.Protocol per keep-alive connection.

Hand-written on purpose. aiohttp and httpx add about a millisecond of p99 timing error per
request on a 2-core machine (their per-chunk stream readers wake a coroutine for every chunk);
here every received byte block is stamped with `perf_counter_ns` the moment the event loop
hands it over, parsed by httptools (C) and kept raw, with no coroutine and no task per
request. The response is decoded only after the level ends (`record.decode_events`).

Every request carries its own `X-Request-Id` (`kvlab-` and a random uuid), written into the
prebuilt bytes, so nothing is added between the clock and the socket; an engine that takes
the header uses it as its request id (vLLM: `chatcmpl-<id>`, the answer's `id`), and kvlab's
proxy sends it to both legs and, asked by `X-Kvlab-Timeline: 1`, appends the request's
timeline through it to the stream as an SSE comment, which `record.decode_events` reads after
the level (an engine ignores the header; a comment is ignored by every SSE reader).

What it does: POST a prebuilt request, read one response (status, headers, a chunked or
sized body of server-sent events, or an error body), keep the connection for the next
request when the server allows it. What it does not: redirects, compression, HTTP/2, proxies
from the environment (a load generator must measure the server, not a corporate proxy).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from kvlab.core import InputError
from kvlab.loadgen.record import RequestRecord

_ERROR_BODY_LIMIT = 4096
REQUEST_ID_HEADER = b"X-Request-Id: "


def new_request_id() -> str:
    """A request id no other request shares (`kvlab-` and 32 hex digits)."""
    return f"kvlab-{uuid.uuid4().hex}"


def request_id_of(payload: bytes) -> str:
    """The X-Request-Id a prebuilt request carries ("" when none), read after the level."""
    start = payload.find(REQUEST_ID_HEADER)
    if start < 0:
        return ""
    start += len(REQUEST_ID_HEADER)
    return payload[start:payload.find(b"\r\n", start)].decode("ascii", "replace")


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: host, port, TLS, and the path prefix (normally `/v1`)."""

    host: str
    port: int
    tls: bool
    prefix: str

    @classmethod
    def from_url(cls, base_url: str) -> Endpoint:
        """Parse an OpenAI base URL such as http://127.0.0.1:8200/v1."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(f"--base-url {base_url!r}: give a URL like http://127.0.0.1:8200/v1")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise InputError(f"--base-url {base_url!r}: the port is not a number") from None
        return cls(parts.hostname, port, parts.scheme == "https", parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"

    def request_bytes(self, path: str, body: dict[str, object], api_key: str = "",
                      headers: tuple[tuple[str, str], ...] = (), request_id: str = "") -> bytes:
        """A complete POST with a JSON body, the user's `headers` (checked by the caller: one
        line each; one named as Accept, User-Agent or Authorization replaces kvlab's) and its
        own request id (a new one unless given), built once before any clock starts."""
        data = json.dumps(body, separators=(",", ":")).encode()
        given = {name.lower() for name, _ in headers}
        ours = [("Accept", "text/event-stream"), ("User-Agent", "kvlab-loadgen")]
        if api_key:
            ours.append(("Authorization", f"Bearer {api_key}"))
        lines = "".join(f"{name}: {value}\r\n" for name, value in
                        [*(h for h in ours if h[0].lower() not in given), *headers])
        head = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                f"Content-Type: application/json\r\n{lines}"
                + ("" if "x-request-id" in given
                   else f"X-Request-Id: {request_id or new_request_id()}\r\n")
                + f"X-Kvlab-Timeline: 1\r\nContent-Length: {len(data)}\r\n\r\n")
        return head.encode() + data


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time.

    `start` sends; `on_done(connection, record)` is called exactly once per request, from
    the protocol callbacks, when the response ended or failed.
    """

    def __init__(self, on_done: Callable[[Connection, RequestRecord], None]) -> None:
        self._on_done = on_done
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._record: RequestRecord | None = None
        self._now = 0
        self._buf = b""
        self._error_body = b""
        self._timer: asyncio.TimerHandle | None = None
        self.uses = 0
        self.reusable = True

    @property
    def idle(self) -> bool:
        return self._record is None and self.usable

    @property
    def usable(self) -> bool:
        return self.reusable and self.transport is not None and not self.transport.is_closing()

    # --- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._now = time.perf_counter_ns()
        if self._record is None:
            self.reusable = False  # bytes nobody asked for: this connection is confused
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail("malformed response", str(exc))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.reusable = False
        if self._record is not None:
            self._now = time.perf_counter_ns()
            self._fail("connection closed", str(exc) if exc else "the server closed it")

    # --- httptools callbacks ----------------------------------------------------------
    def on_headers_complete(self) -> None:
        assert self._record is not None
        self._record.headers_ns = self._now
        self._record.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        record = self._record
        assert record is not None
        if record.status != 200:
            if len(self._error_body) < _ERROR_BODY_LIMIT:
                self._error_body += body
            return
        buf = self._buf + body if self._buf else body
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            record.events.append((self._now, buf[start:end]))
            start = end + 2
        self._buf = buf[start:]

    def on_message_complete(self) -> None:
        record = self._record
        assert record is not None
        if self._buf.strip():
            record.events.append((self._now, self._buf))
        if record.status != 200:
            record.error = f"http {record.status}"
            record.error_detail = self._error_body[:_ERROR_BODY_LIMIT].decode("utf-8", "replace")
        if not self._parser.should_keep_alive():
            self.reusable = False
        self._finish()

    # --- requests ---------------------------------------------------------------------
    def start(self, record: RequestRecord, payload: bytes, timeout_s: float,
              loop: asyncio.AbstractEventLoop) -> None:
        """Send one request now; the response is reported through `on_done`."""
        assert self._record is None and self.transport is not None
        self._record = record
        self._buf = b""
        self._error_body = b""
        self.uses += 1
        self._timer = loop.call_later(timeout_s, self._timeout, timeout_s)
        record.sent_ns = time.perf_counter_ns()
        self.transport.write(payload)

    def cancel(self) -> None:
        """Stop the request in flight (Ctrl-C): it is recorded as cancelled, not failed."""
        record = self._record
        if record is None:
            return
        record.cancelled = True
        self._now = time.perf_counter_ns()
        self.reusable = False
        self._finish()
        self.close()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    def _timeout(self, timeout_s: float) -> None:
        self._now = time.perf_counter_ns()
        self._fail("timeout", f"no complete response within {timeout_s:g} s")
        self.close()

    def _fail(self, kind: str, detail: str) -> None:
        record = self._record
        if record is None:
            return
        record.error = record.error or kind
        record.error_detail = record.error_detail or detail
        self.reusable = False
        self._finish()

    def _finish(self) -> None:
        record = self._record
        assert record is not None
        record.end_ns = self._now or time.perf_counter_ns()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._record = None
        self._on_done(self, record)


def tls_context(target: Endpoint) -> ssl.SSLContext | None:
    return ssl.create_default_context() if target.tls else None


async def open_connection(loop: asyncio.AbstractEventLoop, target: Endpoint,
                          on_done: Callable[[Connection, RequestRecord], None],
                          timeout_s: float) -> Connection:
    """A new connection to the target, within `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        _, protocol = await loop.create_connection(
            lambda: Connection(on_done), target.host, target.port, ssl=tls_context(target))
    return protocol
