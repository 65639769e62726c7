"""kvlab's prefill/decode proxy: an OpenAI-compatible front over two sets of engines.

Routes: `POST /v1/completions` and `/v1/chat/completions` (prefill leg, then decode leg,
streamed or not), `GET /v1/models` (a decode engine's), `GET /health` (every leg),
`GET /metrics` (the proxy's own, see `metrics.py`). One `X-Request-Id` (the client's when it
sends a sane one) goes to both legs and back to the client.

Timing a client sees: TTFT through the proxy is prefill's whole answer plus decode's first
token plus the proxy's own time; the proxy necessarily waits for prefill before decode can
start, and `kvlab_proxy_added_seconds` is what it adds beyond the two legs.

A client that sends `X-Kvlab-Timeline: 1` (kvlab's load generator does) gets its request's
timeline after the streamed answer, as one SSE comment, which every SSE reader ignores:
`: kvlab-timeline {"id": ..., "prefill_ns": ..., "handover_ns": ..., "decode_ns": ...,
"proxy_ns": ...}`, durations on the proxy's monotonic clock, which add up to the time from
the request's arrival to decode's first byte handed to the client's socket:
- prefill: prefill's request sent to its whole answer read (its compute; for shared/lmcache
  also its store write, for NIXL its `kv_transfer_params`);
- handover: that answer read to decode's request sent: for NIXL the `kv_transfer_params`
  round trip through the proxy (read from prefill's answer, written into decode's body); for
  shared/lmcache nothing passes through the proxy, so it is its turn-around alone. The KV
  itself moves later, inside decode's first token (a NIXL pull, a store read), where the
  proxy cannot see it apart;
- decode: decode's request sent to its first body byte;
- proxy: the proxy's own time besides: the request's arrival to prefill's request sent, and
  decode's first byte to its hand-over to the client's socket (stamped before the write, so
  that the client cannot have read it earlier: the write itself is the wire's).
It travels with the answer it describes (no store to outgrow, no endpoint that another of
PROXY_WORKERS' processes would answer), costs nothing before the first token, and only when
asked; a length-framed or failed answer carries none.

Errors: before the response starts, a failed leg gives a JSON error naming the leg (503: it
could not be reached; 504: it timed out; 502: it answered 5xx or broken HTTP; a 4xx from an
engine is passed on as that 4xx with its message: the engine owns the API, so the proxy
validates only what it needs itself, a JSON object with a model). After a stream has
started, a failure ends it with an SSE `event: error` and a clean end of the body. Never a
200 carrying an error; never an error body that echoes unbounded input.
A client that goes away cancels its handler, which closes whichever leg was in flight.

With a client key set, /health and /metrics stay open (as Prometheus expects) but name the
engines by role and index; /health shows their URLs to a client that presents the key.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from kvlab.engines import client_host
from kvlab.proxy import pd
from kvlab.proxy.config import ProxyConfig
from kvlab.proxy.front import Front
from kvlab.proxy.legs import Leg, LegPool, mooncake_peers
from kvlab.proxy.limits import connection_cap, raise_file_limit
from kvlab.proxy.metrics import ProxyMetrics
from kvlab.proxy.server import JSON, ClientConnection, Request, error_body
from kvlab.proxy.upstream import Exchange, UpstreamError, request_head

GENERATE = (b"/v1/completions", b"/v1/chat/completions")
_RID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_STATUS_BY_KIND = {"unavailable": 503, "timeout": 504}
_TYPE_BY_STATUS = {502: "bad_gateway", 503: "upstream_unavailable", 504: "upstream_timeout"}
MISSING_PARAMS_HEADER = b"x-kvlab-kv-transfer: missing\r\n"
TIMELINE_HEADER = b"x-kvlab-timeline"  # its value 1: append the timeline to the stream
TIMELINE = (b': kvlab-timeline {"id":"%s","prefill_ns":%d,"handover_ns":%d,"decode_ns":%d,'
            b'"proxy_ns":%d}\n\n')
now_ns = time.perf_counter_ns
GC_GEN0_THRESHOLD = 50_000
SHOWN_BYTES = 100  # of a path or an engine's message, in an error body
log = logging.getLogger("kvlab.proxy")


class Failed(Exception):
    """A request that ends with an error response (and one outcome count)."""

    def __init__(self, status: int, message: str, kind: str, outcome: str, leg: str = "",
                 **extra: object) -> None:
        super().__init__(message)
        self.status, self.outcome, self.leg = status, outcome, leg
        fields = {"leg": leg, **extra} if leg else extra
        self.body = error_body(status, message, kind, **fields)


def request_id(headers: dict[bytes, bytes]) -> bytes:
    given = headers.get(b"x-request-id")
    if given is not None and _RID.fullmatch(given):
        return given
    return uuid.uuid4().hex.encode()


def shown(text: str | bytes, limit: int = SHOWN_BYTES) -> str:
    """At most `limit` characters (or bytes) of a client's or engine's text, for an error
    message, with the whole length when it was cut."""
    head = text[:limit]
    out = head.decode("utf-8", "backslashreplace") if isinstance(head, bytes) else head
    if len(text) <= limit:
        return out
    return f"{out}... ({len(text)} {'bytes' if isinstance(text, bytes) else 'characters'})"


def upstream_message(raw: bytes) -> str:
    """The human part of an engine's error body (vLLM's, OpenAI's or plain text), cut short:
    an engine may echo the client's input in it."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and err.get("message"):
            return shown(str(err["message"]), 1000)
        if isinstance(err, str):
            return shown(err, 1000)
        if doc.get("message"):
            return shown(str(doc["message"]), 1000)
    return shown(raw, 300).strip() or "(empty body)"


def parse_body(raw: bytes) -> dict[str, object]:
    """The client's JSON request, or Failed(400) naming what is wrong."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise Failed(400, f"the request body is not valid JSON ({exc})",
                     "invalid_request_error", "rejected", "client") from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(body, dict):
        raise Failed(400, "the request body must be a JSON object", "invalid_request_error",
                     "rejected", "client")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Failed(400, "field 'model' is required (the served model name)",
                     "invalid_request_error", "rejected", "client", param="model")
    if not isinstance(body.get("stream", False), bool):
        raise Failed(400, "field 'stream' must be true or false", "invalid_request_error",
                     "rejected", "client", param="stream")
    return body


def too_deep() -> Failed:
    return Failed(400, "the request body is nested too deeply to be read",
                  "invalid_request_error", "rejected", "client")


def encode(body: dict[str, object]) -> bytes:
    """A leg's body; Failed(400) when the client's JSON is nested too deeply to write back."""
    try:
        return pd.dumps(body)
    except RecursionError:
        raise too_deep() from None


class ProxyApp:
    """The proxy's state (legs, metrics, connections) and its request handling."""

    def __init__(self, config: ProxyConfig, worker: bool = False) -> None:
        """`worker`: one of several processes on the port (see `workers.py`)."""
        self.config = config
        self.worker = worker
        keyer, log = config.keyer(), config.pick_log()  # the routing layer (legs.py)
        self.prefill = LegPool("prefill", config.prefill, config.balance,
                               config.connect_timeout_s, keyer=keyer, log=log,
                               load_factor=config.load_factor, optional=True)
        self.decode = LegPool("decode", config.decode, config.balance, config.connect_timeout_s,
                              keyer=keyer, log=log, load_factor=config.load_factor)
        self.metrics = ProxyMetrics(shared=worker)
        for pool in (self.prefill, self.decode):
            for i, leg in enumerate(pool.legs):
                # with a client key, what anyone may scrape does not name the engines
                label = f"{pool.role}#{i}" if config.api_key else leg.url
                leg.gauge = self.metrics.outstanding.labels(pool.role, label)
        self.front: Front | None = None
        self.server: asyncio.Server | None = None
        self.port = config.port
        self.agreement: object = None  # what the start-up check returned
        self._bearer = config.api_key.encode()
        auth = config.upstream_key
        self._up_auth = b"authorization: Bearer %s\r\n" % auth.encode() if auth else b""

    # lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Check the legs (unless the config says not to), then listen."""
        cfg = self.config
        self.agreement = await cfg.check_legs()
        port = cfg.bootstrap_port or cfg.kv.bootstrap_port
        if cfg.kv.handover == "bootstrap" and port:
            await mooncake_peers(self.prefill, port)
        limits = cfg.limits
        open_files = raise_file_limit()
        cap = connection_cap(limits.max_connections, open_files)
        if cap < limits.max_connections:
            log.warning("PROXY_MAX_CONNECTIONS=%d lowered to %d per worker: the open-file "
                        "limit is %d (raise it with `ulimit -n`)", limits.max_connections,
                        cap, open_files)
        self.front = front = Front(self.handle, limits, self.metrics, cap)
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            front.protocol, cfg.host, cfg.port, backlog=4096, reuse_address=True,
            reuse_port=self.worker)  # workers share the port; the kernel spreads clients
        self.port = self.server.sockets[0].getsockname()[1]
        front.start()

    async def close(self) -> None:
        """Stop listening, close every client and leg connection, wait for the handlers."""
        if self.server is not None:
            self.server.close()
        if self.front is not None:
            self.front.close()
        tasks = [c.task for c in self.connections if c.task is not None and not c.task.done()]
        for conn in list(self.connections):
            conn.abort()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.prefill.close()
        self.decode.close()
        if self.server is not None:
            await self.server.wait_closed()
            self.server = None

    @property
    def url(self) -> str:
        return f"http://{client_host(self.config.host)}:{self.port}"

    @property
    def connections(self) -> set[ClientConnection]:
        return self.front.connections if self.front is not None else set()

    # routing ---------------------------------------------------------------------------
    def handle(self, conn: ClientConnection, req: Request) -> None:
        path, method = req.path, req.method
        if path in GENERATE or path == b"/v1/models":
            wanted = b"POST" if path in GENERATE else b"GET"
            if method != wanted:
                self._reject(conn, 405, f"use {wanted.decode()} on {path.decode()}")
            elif self._bearer and not self._authorised(req):
                self.metrics.outcome("rejected", "client")
                conn.respond(401, error_body(401, "missing or wrong bearer key",
                                             "authentication_error"),
                             extra=b'www-authenticate: Bearer realm="kvlab"\r\n')
            elif path == b"/v1/models":
                conn.spawn(self._models(conn))
            else:
                conn.spawn(self._generate(conn, req))
        elif path == b"/health" and method == b"GET":
            conn.spawn(self._health(conn, not self._bearer or self._authorised(req)))
        elif path == b"/metrics" and method == b"GET":
            conn.respond(200, self.metrics.exposition(),
                         ctype=b"text/plain; version=0.0.4; charset=utf-8")
        else:
            self._reject(conn, 404, f"no route {method.decode()} {shown(path)}")

    def _authorised(self, req: Request) -> bool:
        given = req.headers.get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        ok = hmac.compare_digest(token.strip(), self._bearer)
        return ok and scheme.lower() == b"bearer"

    def _reject(self, conn: ClientConnection, status: int, message: str) -> None:
        self.metrics.outcome("rejected", "client")
        conn.respond(status, error_body(status, message, "invalid_request_error"))

    # generation: prefill, then decode --------------------------------------------------
    async def _generate(self, conn: ClientConnection, req: Request) -> None:
        rid = request_id(req.headers)
        stage = "prefill"
        try:
            body = parse_body(req.body)
            if self.config.replicas:  # plain replicas: no prefill leg; the timeline's
                # hand-over is then the routing before decode's request (the pick, its key)
                reply, leg, prefill = None, None, (now_ns(), 0)
            else:
                reply, leg, prefill = await self._prefill(req, body, rid)
            stage = "decode"
            await self._decode(conn, req, body, rid, reply, leg, prefill)
        except Failed as failure:
            self.metrics.outcome(failure.outcome, failure.leg)
            conn.respond(failure.status, failure.body, extra=b"x-request-id: %s\r\n" % rid)
        except asyncio.CancelledError:
            self.metrics.aborts[stage].inc()
            self.metrics.outcome("slow_client" if conn.slow else "aborted", "client")
            raise

    def _request(self, leg: Leg, path: bytes, data: bytes, rid: bytes) -> bytes:
        extra = b"x-request-id: %s\r\n%s" % (rid, self._up_auth)
        return request_head(b"POST", path, leg.origin.host_header, len(data), extra) + data

    async def _prefill(self, req: Request, body: dict[str, object],
                       rid: bytes) -> tuple[dict[str, object] | None, Leg, tuple[int, int]]:
        """Prefill's answer (parsed where decode needs it), its leg, and (sent, took) ns."""
        connector = self.config.kv
        data = encode(pd.prefill_body(body, connector, rid.decode()))
        leg = self.prefill.pick(body, rid)
        started = now_ns()
        try:
            ex = await leg.origin.exchange(self._request(leg, req.path, data, rid),
                                           timeout_s=self.config.prefill_timeout_s,
                                           stream=False)
        except UpstreamError as err:
            raise self._leg_failed("prefill", leg, err) from None
        finally:
            self.prefill.done(leg)
        took = now_ns() - started
        self.metrics.prefill_s.observe(took / 1e9)
        if ex.status != 200:
            raise self._leg_refused("prefill", leg, ex.status, ex.body())
        if not pd.prefill_reply_needed(connector):
            return None, leg, (started, took)
        reply = pd.parse_reply(ex.body())
        if reply is None:
            raise Failed(502, f"the prefill leg ({leg.url}) answered 200 with a body that is "
                              "not a JSON object", "bad_gateway", "upstream_error", "prefill")
        return reply, leg, (started, took)

    async def _decode(self, conn: ClientConnection, req: Request, body: dict[str, object],
                      rid: bytes, reply: dict[str, object] | None, prefill_leg: Leg | None,
                      prefill: tuple[int, int]) -> None:
        plan = pd.decode_plan(body, self.config.kv, rid.decode(), reply,
                              prefill_leg.peer if prefill_leg else None)
        if plan.params_missing:
            self.metrics.no_params.inc()
        data = req.body if plan.body is None else encode(plan.body)
        leg = self.decode.pick(body, rid)
        sent = now_ns()
        try:
            ex = await leg.origin.exchange(self._request(leg, req.path, data, rid),
                                           timeout_s=self.config.decode_timeout_s, stream=True)
            try:
                await self._relay(conn, ex, leg, rid, plan.params_missing,
                                  (req.arrived_ns, *prefill, sent),
                                  req.headers.get(TIMELINE_HEADER) == b"1")
            except BaseException:
                ex.abort()
                raise
        except UpstreamError as err:
            raise self._leg_failed("decode", leg, err) from None
        finally:
            self.decode.done(leg)

    async def _relay(self, conn: ClientConnection, ex: Exchange, leg: Leg, rid: bytes,
                     params_missing: bool, stamps: tuple[int, int, int, int],
                     timeline: bool) -> None:
        """Pass decode's answer through: status checked, head rewritten, body untouched
        (the timeline comment after it, when asked). `stamps`: the request's arrival,
        prefill's request sent, prefill's time, decode's request sent."""
        if ex.status != 200:
            await ex.done
            raise self._leg_refused("decode", leg, ex.status, ex.body())
        ctype = ex.headers.get(b"content-type", JSON)
        length = ex.headers.get(b"content-length")
        sse = ctype.startswith(b"text/event-stream")
        extra = b"x-request-id: %s\r\n%s%s" % (
            rid, MISSING_PARAMS_HEADER if params_missing else b"",
            b"cache-control: no-cache\r\n" if sse else b"")
        conn.start(200, ctype, extra, int(length) if length and length.isdigit() else None)
        conn.relay(ex)
        metrics = self.metrics
        arrived, prefill_sent, prefill_ns, sent = stamps
        own_ns = sent - arrived - prefill_ns  # the proxy's own time before decode's request
        handed = 0  # decode's first byte handed to the client's socket: before the write, so
        # the client cannot read it before this stamp (the write is the wire's, not ours)

        def first(piece: bytes) -> None:
            nonlocal handed
            handed = now_ns()
            conn.write(piece)
            ex.sink = conn.write  # every later piece goes straight through
            out = now_ns()
            metrics.decode_s.observe((ex.first_body_ns - sent) / 1e9)
            metrics.added_s.observe((own_ns + out - ex.first_body_ns) / 1e9)

        ex.attach(first)
        try:
            await ex.done
        except UpstreamError as err:
            leg.failed(err.kind)
            metrics.outcome("stream_error", "decode")
            if sse and conn.can_append:
                event = error_body(502, f"the decode leg ({leg.url}) failed mid-stream: {err}",
                                   "bad_gateway", leg="decode")
                conn.write(b"event: error\ndata: %s\n\n" % event)
                conn.end()
            else:
                conn.abort()  # a length-framed body cannot carry an error: cut it visibly
            return
        last = b""
        if timeline and sse and handed and conn.can_append:
            handover = sent - prefill_sent - prefill_ns
            last = TIMELINE % (rid, prefill_ns, handover, ex.first_body_ns - sent,
                               own_ns - handover + handed - ex.first_body_ns)
        conn.end(last)
        metrics.outcome("ok")

    def _leg_failed(self, name: str, leg: Leg, err: UpstreamError) -> Failed:
        leg.failed(err.kind)  # counted, and a dead engine left out for a while (legs.py)
        status = _STATUS_BY_KIND.get(err.kind, 502)
        outcome = {503: "unavailable", 504: "timeout"}.get(status, "upstream_error")
        return Failed(status, f"the {name} leg ({leg.url}) failed: {err}",
                      _TYPE_BY_STATUS[status], outcome, name)

    def _leg_refused(self, name: str, leg: Leg, status: int, raw: bytes) -> Failed:
        out = status if 400 <= status < 500 or status in (503, 504) else 502
        kind = "upstream_rejected" if out < 500 else _TYPE_BY_STATUS[out]
        outcome = "upstream_rejected" if out < 500 else "upstream_error"
        return Failed(out, f"the {name} leg ({leg.url}) answered {status}: "
                           f"{upstream_message(raw)}", kind, outcome, name,
                      upstream_status=status)

    # other routes ----------------------------------------------------------------------
    async def _get(self, leg: Leg, path: bytes) -> Exchange:
        head = request_head(b"GET", path, leg.origin.host_header, 0, self._up_auth)
        return await leg.origin.exchange(head, timeout_s=self.config.connect_timeout_s,
                                         stream=False)

    async def _models(self, conn: ClientConnection) -> None:
        leg = self.decode.pick()
        try:
            ex = await self._get(leg, b"/v1/models")
        except UpstreamError as err:
            failure = self._leg_failed("decode", leg, err)
            conn.respond(failure.status, failure.body)
            return
        finally:
            self.decode.done(leg)
        conn.respond(ex.status, ex.body(), ctype=ex.headers.get(b"content-type", JSON))

    async def _health(self, conn: ClientConnection, reveal: bool) -> None:
        """Every leg's state; named by URL only to a client that may know them."""
        legs = [*self.prefill.legs, *self.decode.legs]
        states = await asyncio.gather(*(self._probe(leg) for leg in legs))
        names = [f"{leg.role} {leg.url}" if reveal else f"{leg.role} #{i}"
                 for pool in (self.prefill, self.decode) for i, leg in enumerate(pool.legs)]
        report = dict(zip(names, states, strict=True))
        healthy = all(state == "ok" for state in states)
        doc = {"status": "ok" if healthy else "unhealthy", "legs": report}
        conn.respond(200 if healthy else 503, json.dumps(doc).encode())

    async def _probe(self, leg: Leg) -> str:
        try:
            ex = await self._get(leg, b"/health")
        except UpstreamError as err:
            return f"failed: {err}"
        return "ok" if ex.status == 200 else f"answered {ex.status}"


def loop_runner() -> asyncio.Runner:
    """The event loop the proxy runs on: uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


async def serve(config: ProxyConfig, on_ready: Callable[[ProxyApp], None] | None = None,
                stop: asyncio.Event | None = None, worker: bool = False) -> None:
    """Check the legs, listen, call `on_ready`, serve until `stop` is set or cancelled."""
    async with running(config, worker) as app:
        # a long-running server: move start-up objects out of the collector's way and let
        # the youngest generation grow, so full collections stay short (p99, not p50)
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        if on_ready is not None:
            on_ready(app)
        await (stop or asyncio.Event()).wait()


@asynccontextmanager
async def running(config: ProxyConfig, worker: bool = False) -> AsyncIterator[ProxyApp]:
    """A started proxy (legs checked, listening) that is always closed afterwards."""
    app = ProxyApp(config, worker)
    try:
        await app.start()
        yield app
    finally:
        await app.close()
