"""An in-process fake engine for fault injection: what a real one cannot be made to do on cue.

It answers the OpenAI routes like an engine, and on request it stalls, dies mid-stream,
answers an error status, answers garbage, or leaves out `kv_transfer_params`. It records
every request (body, headers) and, with monotonic nanosecond stamps, when each connection
was closed by the other side, so a test can prove a proxy closed a leg and how fast.
Real sockets on loopback; speed is no concern here (the benchmarks use a fast fake).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

# "ok", "stall", "die", "status", "garbage", "no_params", "stall_stream", and "validate":
# answer 400 as vLLM does to a body without prompt/messages or with max_tokens out of range
Mode = str


@dataclass
class Behaviour:
    mode: Mode = "ok"
    delay_s: float = 0.0  # before the answer starts ("stall": forever unless closed)
    chunks: int = 4
    itl_s: float = 0.002
    die_after: int = 2  # "die": chunks sent before the connection is cut
    status: int = 500  # "status": the error answered
    model: str = "fake-model"
    max_model_len: int = 4096
    version: str = "0.0.0-fake"  # answered on /version, as vLLM does
    pad: int = 0  # bytes of filler in each streamed event (to outrun a slow reader)
    vllm_metrics: bool = False  # answer /metrics with vLLM's counters of what it finished
    dies_on: str = ""  # a generation on this path kills the engine: it stops listening


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    arrived_ns: int
    closed_ns: int | None = None  # the peer closed the connection while we were answering
    finished: bool = False


@dataclass
class FaultUpstream:
    behaviour: Behaviour = field(default_factory=Behaviour)
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FaultUpstream:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def generations(self) -> list[Seen]:
        return [s for s in self.seen if s.path.startswith("/v1/") and s.path != "/v1/models"]

    def _metrics(self) -> bytes:
        """vLLM's counters as it would count this fake's answers: a finished generation is a
        success with its 3 prompt tokens; nothing ever comes from a connector."""
        done = sum(s.finished for s in self.seen)
        return (f'vllm:request_success_total{{finished_reason="length"}} {done}\n'
                f"vllm:prompt_tokens_total {3 * done}\n"
                "vllm:external_prefix_cache_hits_total 0\n"
                'vllm:cache_config_info{block_size="16"} 1\n').encode()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                if not await self._answer(request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _answer(self, request: tuple[str, str, dict[str, str], bytes],
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        _, path, headers, raw = request
        b = self.behaviour
        if path == "/v1/models":
            card = {"id": b.model, "object": "model", "max_model_len": b.max_model_len}
            return await _send(writer, 200, {"object": "list", "data": [card]}, close=False)
        if path == "/health":
            return await _send(writer, 200, {}, close=False)
        if path == "/version":
            return await _send(writer, 200, {"version": b.version}, close=False)
        if path == "/metrics" and b.vllm_metrics:
            return await _send_raw(writer, 200, self._metrics(), b"text/plain", close=False)
        if path in ("/metrics", "/tokenize", "/props"):
            return await _send(writer, 404, {}, close=False)
        body = json.loads(raw) if raw else {}
        seen = Seen(path, headers, body, time.perf_counter_ns())
        self.seen.append(seen)
        if b.dies_on and path == b.dies_on and self._server is not None:
            self._server.close()  # as an engine that died loading what it was sent
            return False
        # watch for the peer closing while we answer: EOF on the read side
        watcher = asyncio.ensure_future(reader.read(1))
        try:
            return await self._generate(seen, writer, watcher)
        except ConnectionError:  # the peer went away while we were writing
            seen.closed_ns = seen.closed_ns or time.perf_counter_ns()
            raise
        finally:
            if watcher.done() and not watcher.cancelled() and watcher.result() == b"":
                seen.closed_ns = seen.closed_ns or time.perf_counter_ns()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await watcher

    async def _generate(self, seen: Seen, writer: asyncio.StreamWriter,
                        watcher: asyncio.Future[bytes]) -> bool:
        b, body = self.behaviour, seen.body
        if b.mode == "stall" or b.delay_s:
            wait = None if b.mode == "stall" else b.delay_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(watcher), wait)
            if watcher.done():
                seen.closed_ns = time.perf_counter_ns()
                return False
        if b.mode == "status":
            return await _send(writer, b.status, {"error": {"message": "fake engine failure",
                                                            "type": "InternalError"}})
        if b.mode == "garbage":
            return await _send_raw(writer, 200, b"this is not json", b"application/json")
        if b.mode == "validate" and (problem := _invalid(body, b.max_model_len)):
            return await _send(writer, 400, {"object": "error", "message": problem,
                                             "type": "BadRequestError", "code": 400})
        if not body.get("stream"):
            reply: dict[str, Any] = {"id": "x", "object": "text_completion",
                                     "choices": [{"index": 0, "text": "t"}],
                                     "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
            kv = body.get("kv_transfer_params") or {}
            if kv.get("do_remote_decode") and b.mode != "no_params":
                reply["kv_transfer_params"] = {"do_remote_prefill": True, "remote_block_ids":
                                               [[1, 2]], "remote_engine_id": "fake",
                                               "remote_request_id": seen.headers.get(
                                                   "x-request-id")}
            seen.finished = True
            return await _send(writer, 200, reply)
        return await self._stream(seen, writer, watcher)

    async def _stream(self, seen: Seen, writer: asyncio.StreamWriter,
                      watcher: asyncio.Future[bytes]) -> bool:
        b = self.behaviour
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                     b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        for i in range(b.chunks):
            if b.mode == "die" and i == b.die_after:
                writer.transport.abort()
                return False
            if b.mode == "stall_stream" and i == 1:
                await asyncio.wait([watcher])
                seen.closed_ns = time.perf_counter_ns()
                return False
            event = b'data: {"choices":[{"index":0,"text":"t%d%s"}]}\n\n' % (i, b"." * b.pad)
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            done, _ = await asyncio.wait([watcher], timeout=b.itl_s)
            if done:
                seen.closed_ns = time.perf_counter_ns()
                return False
        done_event = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done_event), done_event))
        await writer.drain()
        seen.finished = True
        return False


def _invalid(body: dict[str, Any], max_model_len: int) -> str | None:
    """Why an engine would refuse this body with a 400 (in vLLM's error shape), or None."""
    if "prompt" not in body and "messages" not in body:
        return "Either prompt or messages must be provided"
    limit = body.get("max_tokens", 16)
    if not isinstance(limit, int) or not 1 <= limit <= max_model_len:
        return f"max_tokens must be at least 1 and at most {max_model_len}, got {limit}."
    return None


async def _read_request(reader: asyncio.StreamReader
                        ) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    raw = await reader.readexactly(length) if length else b""
    return method, path, headers, raw


async def _send(writer: asyncio.StreamWriter, status: int, doc: dict[str, Any],
                close: bool = True) -> bool:
    return await _send_raw(writer, status, json.dumps(doc).encode(), b"application/json", close)


async def _send_raw(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: bytes,
                    close: bool = True) -> bool:
    """One response; generation answers close the connection, so a watcher reading for EOF
    can never swallow the first byte of a next request."""
    writer.write(b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status, ctype, len(body), b"connection: close\r\n" if close else b"", body))
    await writer.drain()
    return not close
