"""Properties of the proxy's request parsing, with hypothesis (issue 14).

The client connection (`kvlab.proxy.server`) is fed bytes directly, through a transport
that records what it writes, with a handler that answers 200 to whatever it is given:

- well-formed requests parse the same however the bytes are split into reads, pipelined or
  not, and each reaches the handler exactly once, in order;
- a head that breaks a limit is refused with that limit's status (414 request line, 431 a
  header line or the header count, 400 the whole head), one that breaks none is served, and
  the verdict does not depend on how the head was split;
- arbitrary bytes (and fragments of HTTP, Upgrade and CONNECT among them) never raise out of
  the connection and never get a 5xx; after a refusal nothing more reaches the handler;
- whatever a client sends as X-Request-Id, the id the proxy uses (sent to both legs, and in
  its timeline comment) is a header value and a JSON string as it stands: the client's when
  it is a sane one, else a fresh one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adversarial.wire import replies
from kvlab.proxy.front import Front
from kvlab.proxy.limits import ClientLimits
from kvlab.proxy.metrics import ProxyMetrics
from kvlab.proxy.server import ClientConnection, Request

SMALL = ClientLimits(max_request_line_bytes=40, max_header_bytes=30, max_headers=6,
                     max_head_bytes=200, max_body_bytes=64)
PROPS = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])
TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
VALUE = st.text("abcdefghijklmnopqrstuvwxyz0123456789 ;=/.", max_size=24).map(str.strip)


class Recorder:
    """The smallest asyncio transport: remembers what was written and whether it closed."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@dataclass
class Outcome:
    served: list[tuple[bytes, bytes, dict[bytes, bytes], bytes]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)


async def _feed(chunks: list[bytes], limits: ClientLimits) -> Outcome:
    out = Outcome()

    def handler(conn: ClientConnection, req: Request) -> None:
        out.served.append((req.method, req.path, dict(req.headers), req.body))
        conn.respond(200, b"{}")

    front = Front(handler, limits, ProxyMetrics(), cap=8)
    conn = front.protocol()
    transport = Recorder()
    conn.connection_made(transport)  # type: ignore[arg-type]
    for chunk in chunks:
        if transport.closing:
            break
        conn.data_received(chunk)
    conn.connection_lost(None)
    out.statuses = [r.status for r in replies(bytes(transport.written)) if r.status >= 200]
    return out


def feed(chunks: list[bytes], limits: ClientLimits = SMALL) -> Outcome:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_feed(chunks, limits))
    finally:
        loop.close()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def cuts_of(raw: bytes) -> st.SearchStrategy[list[int]]:
    """Places to split `raw`: anywhere, and often just after a CR or LF (line ends are where
    a meter that counts lines could go wrong)."""
    ends = [i + 1 for i, byte in enumerate(raw) if byte in b"\r\n"]
    anywhere = st.integers(0, len(raw))
    return st.lists(st.sampled_from(ends) | anywhere if ends else anywhere, max_size=8)


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, tuple[bytes, bytes, dict[bytes, bytes], bytes]]:
    """One well-formed request within SMALL's limits, and what the handler should get."""
    method = draw(st.sampled_from([b"GET", b"POST"]))
    path = b"/" + draw(TOKEN).encode()
    headers = {f"x-{n}"[:10].encode(): v.encode()[:12]
               for n, v in draw(st.dictionaries(TOKEN, VALUE, max_size=3)).items()}
    body = draw(st.binary(max_size=40)) if method == b"POST" else b""
    if method == b"POST":
        headers[b"content-length"] = b"%d" % len(body)
    head = b"%s %s HTTP/1.1\r\n%s\r\n" % (
        method, path, b"".join(b"%s: %s\r\n" % kv for kv in headers.items()))
    return head + body, (method, path, headers, body)


@PROPS
@given(st.lists(requests(), min_size=1, max_size=4), st.data())
def test_well_formed_requests_parse_the_same_however_split(
        batch: list[tuple[bytes, Any]], data: st.DataObject) -> None:
    raw = b"".join(request for request, _ in batch)
    whole = feed([raw])
    assert whole.served == [expected for _, expected in batch]
    assert whole.statuses == [200] * len(batch)
    assert feed(split(raw, data.draw(cuts_of(raw)))) == whole


def _near(limit: int, low: int, high: int) -> st.SearchStrategy[int]:
    """A length anywhere in [low, high], often within two of `limit` (where bugs live)."""
    return st.integers(low, high) | st.integers(limit - 2, limit + 2)


@st.composite
def heads(draw: st.DrawFn) -> tuple[bytes, set[int]]:
    """A GET head of random shape, and the statuses the limits it breaks allow."""
    line = b"GET /%s HTTP/1.1"
    url = b"u" * (draw(_near(SMALL.max_request_line_bytes, 14, 50)) - len(line % b""))
    lines = [line % url]
    for i in range(draw(_near(SMALL.max_headers, 0, 9))):
        name = b"x-%d: " % i
        lines.append(name + b"v" * max(0, draw(_near(SMALL.max_header_bytes, 5, 40))
                                       - len(name)))
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    broken = set()
    if len(lines[0]) > SMALL.max_request_line_bytes:
        broken.add(414)
    if any(len(line) > SMALL.max_header_bytes for line in lines[1:]) or \
            len(lines) - 1 > SMALL.max_headers:
        broken.add(431)
    if len(head) > SMALL.max_head_bytes:
        broken.add(400)
    return head, broken


@PROPS
@given(heads(), st.data())
def test_a_head_past_a_limit_gets_that_limits_status(case: tuple[bytes, set[int]],
                                                      data: st.DataObject) -> None:
    head, broken = case
    whole = feed([head])
    if not broken:
        assert whole.statuses == [200] and len(whole.served) == 1
    else:
        assert len(whole.statuses) == 1 and whole.statuses[0] in broken, (whole, broken)
        assert whole.served == []
    assert feed(split(head, data.draw(cuts_of(head)))) == whole


FRAGMENTS = st.sampled_from([
    b"GET / HTTP/1.1\r\n", b"POST /v1/completions HTTP/1.1\r\n", b"CONNECT a:1 HTTP/1.1\r\n",
    b"GET / HTTP/1.0\r\n", b"host: x\r\n", b"content-length: 3\r\n", b"content-length: 99\r\n",
    b"transfer-encoding: chunked\r\n", b"connection: upgrade\r\n", b"upgrade: websocket\r\n",
    b"expect: 100-continue\r\n", b"connection: close\r\n", b"\r\n", b"\r\n\r\n", b"abc",
    b"3\r\nabc\r\n0\r\n\r\n", b"x-long: " + b"y" * 40 + b"\r\n", b"\x00", b" ", b"\n",
])


@PROPS
@given(st.lists(st.one_of(FRAGMENTS, st.binary(max_size=30)), max_size=25), st.data())
def test_arbitrary_bytes_never_crash_or_get_a_5xx(parts: list[bytes],
                                                  data: st.DataObject) -> None:
    raw = b"".join(parts)
    outcome = feed(split(raw, data.draw(cuts_of(raw))))
    assert all(s == 200 or 400 <= s < 500 for s in outcome.statuses), outcome.statuses
    refused = [i for i, s in enumerate(outcome.statuses) if s != 200]
    if refused:  # the refusal is the last thing on the connection
        assert refused == [len(outcome.statuses) - 1]
        assert len(outcome.served) == len(outcome.statuses) - 1


@PROPS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=140).map(str.encode)))
def test_any_request_id_becomes_a_safe_one(given_id: bytes) -> None:
    import json

    from kvlab.observe import sse
    from kvlab.proxy.app import TIMELINE, request_id

    rid = request_id({b"x-request-id": given_id})
    assert 1 <= len(rid) <= 128 and all(c in SAFE_ID for c in rid)
    sane = 1 <= len(given_id) <= 128 and all(c in SAFE_ID for c in given_id)
    assert (rid == given_id) if sane else (len(rid) == 32 and rid != given_id)
    comment = TIMELINE % (rid, 1, 2, 3, 4)
    found = sse.timeline_of(comment.rstrip(b"\n"))
    assert found == {"id": rid.decode(), "prefill_ns": 1, "handover_ns": 2, "decode_ns": 3,
                     "proxy_ns": 4}, json.dumps(rid.decode())


SAFE_ID = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
