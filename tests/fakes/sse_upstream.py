"""A fake OpenAI streaming server for fault injection in load-generator tests.

It does on cue what a real engine will not: answer every Nth request with HTTP 500, stall
every Nth stream after its first chunk, close the connection after each response, or reset
its /metrics counters as if the engine had restarted. Everything else (chunked SSE, a
role-only first chunk like vLLM's, `usage` in a last chunk when asked) follows the OpenAI
shapes, and a reasoning model's stream as vLLM documents it (`reasoning`: the first tokens
are `delta.reasoning`, the field vLLM 0.11 and later stream, the answer follows in
`delta.content`). On request it also answers vLLM's /tokenize of a text prompt and /detokenize
(`tokenizer`), with a toy tokenizer: a word's id from its letters, an id's text `w<id>`. Runs
in the test's own event loop (`async with SseUpstream(...) as up`) or as a
script: `python sse_upstream.py --port N [--fail-every 3] [--stall-every 2] ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Behaviour:
    tokens: int = 8
    ttft_s: float = 0.005
    itl_s: float = 0.002
    fail_every: int = 0  # every Nth completion request gets HTTP 500
    stall_every: int = 0  # every Nth stream stalls after its first chunk
    close_after: bool = False  # Connection: close after each response
    usage: bool = True  # honour stream_options.include_usage
    prompt_tokens: int = 100
    reasoning: int = 0  # chat: this many first tokens are reasoning (`delta.reasoning`)
    tokenizer: tuple[str, ...] = ()  # the routes answered: "/tokenize", "/detokenize"
    # after this many tokens, the engine dies: "error" sends vLLM's error event (an engine
    # core gone) and ends the stream; "cut" ends the response with no finish_reason, no
    # [DONE] (a front whose engine went away)
    die_after: int | None = None
    die_how: str = "cut"
    die_from: int = 1  # the first completion request that dies (earlier ones answer)
    models: tuple[str, ...] = ()  # ids /v1/models lists (none: it answers 404, as before)


@dataclass
class Counters:
    requests: int = 0
    failed: int = 0
    stalled: int = 0
    connections: int = 0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorization: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # each request's, lower-cased
    detokenized: list[list[int]] = field(default_factory=list)  # /detokenize's token lists


class SseUpstream:
    """`async with SseUpstream(Behaviour(...)) as up:` then use `up.base_url`."""

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0) -> None:
        self.behaviour = behaviour or Behaviour()
        self.counters = Counters()
        self._port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = asyncio.Event()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> SseUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._closing.set()  # wakes stalled streams
        for writer in list(self._writers):
            writer.close()  # the handlers see end-of-file and return
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def restart_counters(self) -> None:
        """What an engine restart does to its counters: they start again from zero."""
        self.counters.prefix_hits = 0.0
        self.counters.prefix_queries = 0.0

    def metrics_text(self) -> str:
        c = self.counters
        return ("# TYPE vllm:prefix_cache_hits counter\n"
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="fake"}} {c.prefix_hits}\n'
                "# TYPE vllm:prefix_cache_queries counter\n"
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="fake"}} '
                f"{c.prefix_queries}\n")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.counters.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        pairs = (ln.partition(":") for ln in lines[1:] if ln)
        headers = {k.lower(): v.strip() for k, _, v in pairs}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "GET" and path == "/metrics":
            return await self._plain(writer, 200, self.metrics_text().encode(), "text/plain")
        if method == "GET" and path == "/v1/models" and self.behaviour.models:
            listed = {"object": "list", "data": [{"id": m, "object": "model"}
                                                 for m in self.behaviour.models]}
            return await self._plain(writer, 200, json.dumps(listed).encode())
        if method == "POST" and path in self.behaviour.tokenizer:
            return await self._tokenizer(writer, path, json.loads(body))
        if method != "POST" or not path.endswith("completions"):
            return await self._plain(writer, 404, b'{"error":"not found"}')
        self.counters.authorization.append(headers.get("authorization", ""))
        self.counters.headers.append(headers)
        return await self._complete(writer, json.loads(body), path.endswith("chat/completions"))

    async def _tokenizer(self, writer: asyncio.StreamWriter, path: str,
                         body: dict[str, Any]) -> bool:
        """vLLM's shapes: {"prompt"} -> {"tokens"}, {"model", "tokens"} -> {"prompt"}."""
        if path == "/detokenize" and isinstance(body.get("tokens"), list):
            self.counters.detokenized.append(body["tokens"])
            answer = {"prompt": " ".join(f"w{t}" for t in body["tokens"])}
        elif path == "/tokenize" and isinstance(body.get("prompt"), str):
            answer = {"tokens": [toy_token(w) for w in body["prompt"].split()]}
        else:
            return await self._plain(writer, 400, b'{"error":"bad request"}')
        return await self._plain(writer, 200, json.dumps(answer).encode())

    async def _plain(self, writer: asyncio.StreamWriter, status: int, body: bytes,
                     ctype: str = "application/json") -> bool:
        close = "Connection: close\r\n" if self.behaviour.close_after else ""
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: "
                     f"{len(body)}\r\n{close}\r\n".encode() + body)
        await writer.drain()
        return not self.behaviour.close_after

    async def _complete(self, writer: asyncio.StreamWriter, body: dict[str, Any],
                        chat: bool) -> bool:
        b, c = self.behaviour, self.counters
        c.requests += 1
        c.bodies.append(body)
        c.prefix_queries += b.prompt_tokens
        c.prefix_hits += b.prompt_tokens // 2
        if b.fail_every and c.requests % b.fail_every == 0:
            c.failed += 1
            return await self._plain(writer, 500, b'{"object":"error","message":"injected"}')
        close = "Connection: close\r\n" if b.close_after else ""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n" + close.encode() + b"\r\n")
        stall = bool(b.stall_every and c.requests % b.stall_every == 0)
        n = int(body.get("max_tokens") or b.tokens)
        if chat:  # vLLM's first chat chunk: the role, no content
            self._event(writer, {"choices": [{"index": 0, "delta": {"role": "assistant",
                                                                    "content": ""}}]})
        await asyncio.sleep(b.ttft_s)
        for i in range(n):
            kind = "reasoning" if i < b.reasoning else "content"
            piece = {"index": 0, "delta": {kind: f" t{i}"}} if chat else \
                {"index": 0, "text": f" t{i}"}
            self._event(writer, {"choices": [piece]})
            await writer.drain()
            if stall:
                c.stalled += 1
                await self._closing.wait()
                return False
            if b.die_after is not None and i + 1 >= b.die_after and c.requests >= b.die_from:
                if b.die_how == "error":
                    self._event(writer, {"error": {"object": "error", "type": "Internal",
                                                   "message": "EngineCore encountered an "
                                                              "issue. See stack trace."}})
                    writer.write(self._chunk(b"data: [DONE]\n\n"))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                return False
            await asyncio.sleep(b.itl_s)
        if b.usage and (body.get("stream_options") or {}).get("include_usage"):
            self._event(writer, {"choices": [], "usage": {
                "prompt_tokens": b.prompt_tokens, "completion_tokens": n,
                "total_tokens": b.prompt_tokens + n}})
        writer.write(self._chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return not b.close_after

    def _event(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        writer.write(self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n"))

    @staticmethod
    def _chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)


def toy_token(word: str) -> int:
    """The toy tokenizer's id of a word."""
    return len(word) * 1000 + sum(map(ord, word)) % 1000


async def _main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--stall-every", type=int, default=0)
    ap.add_argument("--itl-s", type=float, default=0.002)
    args = ap.parse_args()
    behaviour = Behaviour(tokens=args.tokens, fail_every=args.fail_every,
                          stall_every=args.stall_every, itl_s=args.itl_s)
    async with SseUpstream(behaviour, args.port):
        print(f"listening on {args.port}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main())
