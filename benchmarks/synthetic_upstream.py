#!/usr/bin/env python3
"""A fast synthetic OpenAI-compatible engine on loopback, for benchmarks and soak tests.

It owns timing truth: every streamed chunk carries the server's own monotonic stamps, so a
client's or a proxy's timing error can be measured exactly. It deliberately knows nothing
about models, tokens or KV: text is filler, usage counts are nominal.

Interface (kept stable: the proxy benchmark and the load-generator benchmark both use it)
  --port N        listen on 127.0.0.1:N (required)
  --ttft-ms F     first token this long after the request arrived (default 20)
  --itl-ms F      then one token every F ms (default 5); the schedule is absolute, anchored
                  at the arrival stamp, so a late tick does not push later ones
  --tokens N      tokens per reply when the request gives no max_tokens (default 32)
  --model NAME    id in /v1/models and replies (default fake-model)
  --max-model-len N  reported in /v1/models (default 32768)
  --name NAME     shown in logs and /stats (default upstream)

  POST /v1/completions, /v1/chat/completions
      stream=true : SSE, `text/event-stream`, chunked; every chunk's JSON carries
                    srv_arr_ns (time.perf_counter_ns when the request arrived),
                    srv_ns (just before the chunk was written) and srv_i (token index);
                    then `data: [DONE]`. stream_options.include_usage adds a usage chunk.
      stream=false: one JSON body after ttft + (n-1)*itl; when the request carries
                    kv_transfer_params with do_remote_decode, the reply carries NIXL-style
                    kv_transfer_params (remote_request_id = the X-Request-Id received).
      n = max_tokens, else max_completion_tokens, else --tokens.
  GET  /health, /v1/models
  GET  /stats   per-request truth: {"name", "pid", "requests", "records": [...]}; a record
                has sid, path, xrid, stream, n, kv_in (kv_transfer_params received),
                arr_ns, first_ns, last_ns, sent, done, closed_ns (client went away early),
                opening (the prompt's first 24 characters, JSON-quoted)
  POST /reset   forget the records

perf_counter_ns is CLOCK_MONOTONIC on Linux, so stamps compare across processes.
Built on asyncio.Protocol + httptools (+ uvloop when present): a framework's per-chunk cost
would be measured as the upstream's, not the client's or the proxy's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any, cast

import httptools

now_ns = time.perf_counter_ns
MAX_RECORDS = 500_000
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
             b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")


class State:
    """Options and the per-request records shared by every connection."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ttft_s = args.ttft_ms / 1000.0
        self.itl_s = args.itl_ms / 1000.0
        self.records: list[dict[str, Any]] = []
        self.requests = 0
        self.created = int(time.time())

    def models(self) -> bytes:
        card = {"id": self.args.model, "object": "model", "created": self.created,
                "owned_by": "synthetic", "root": self.args.model,
                "max_model_len": self.args.max_model_len}
        return json.dumps({"object": "list", "data": [card]}).encode()


def response(status: int, body: bytes, keep_alive: bool = True) -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status, _REASONS.get(status, b"Error"), len(body))
    return head + (b"\r\n" if keep_alive else b"connection: close\r\n\r\n") + body


class Reply:
    """One generation in flight: a streamed reply ticks, a whole reply fires once."""

    __slots__ = ("chat", "conn", "handle", "i", "n", "rec", "t0", "usage")

    def __init__(self, conn: Connection, rec: dict[str, Any], n: int, chat: bool,
                 usage: bool) -> None:
        self.conn, self.rec, self.n, self.chat, self.usage = conn, rec, n, chat, usage
        self.i = 0
        # loop.time() is CLOCK_MONOTONIC in seconds: the same clock as the arrival stamp
        self.t0 = rec["arr_ns"] / 1e9
        self.handle: asyncio.TimerHandle | None = None

    def start(self, stream: bool, kv: bool) -> None:
        st = self.conn.state
        if stream:
            self.conn.write(_SSE_HEAD)
            self.handle = self.conn.loop.call_at(self.t0 + st.ttft_s, self.tick)
        else:
            at = self.t0 + st.ttft_s + (self.n - 1) * st.itl_s
            self.handle = self.conn.loop.call_at(at, self.whole, kv)

    def _chunk_json(self, i: int, stamp: int) -> bytes:
        rec, st = self.rec, self.conn.state
        text = f"<{rec['sid']}>" if i == 0 else " tok"
        finish = '"length"' if i == self.n - 1 else "null"
        if self.chat:
            role = '"role":"assistant",' if i == 0 else ""
            choice = (f'{{"index":0,"delta":{{{role}"content":"{text}"}},"logprobs":null,'
                      f'"finish_reason":{finish}}}')
            kind = "chat.completion.chunk"
        else:
            choice = f'{{"index":0,"text":"{text}","logprobs":null,"finish_reason":{finish}}}'
            kind = "text_completion"
        return (f'{{"id":"cmpl-{rec["sid"]}","object":"{kind}","created":{st.created},'
                f'"model":"{st.args.model}","choices":[{choice}],"srv_arr_ns":{rec["arr_ns"]},'
                f'"srv_ns":{stamp},"srv_i":{i}}}').encode()

    def tick(self) -> None:
        conn, rec, i = self.conn, self.rec, self.i
        stamp = now_ns()
        last = i == self.n - 1
        out = b"data: " + self._chunk_json(i, stamp) + b"\n\n"
        if last:
            if self.usage:
                out += b'data: {"id":"cmpl-%d","choices":[],"usage":%s}\n\n' % (
                    rec["sid"], self._usage().encode())
            out += b"data: [DONE]\n\n"
        payload = b"%x\r\n%s\r\n" % (len(out), out)
        if last:
            payload += b"0\r\n\r\n"
        conn.write(payload)
        if i == 0:
            rec["first_ns"] = stamp
        rec["last_ns"] = stamp
        rec["sent"] = i + 1
        self.i = i + 1
        if last:
            self.finish()
        else:
            st = conn.state
            self.handle = conn.loop.call_at(self.t0 + st.ttft_s + self.i * st.itl_s, self.tick)

    def _usage(self) -> str:
        prompt = self.rec["prompt_tokens"]
        return (f'{{"prompt_tokens":{prompt},"completion_tokens":{self.n},'
                f'"total_tokens":{prompt + self.n}}}')

    def whole(self, kv: bool) -> None:
        rec, st = self.rec, self.conn.state
        stamp = now_ns()
        text = f"<{rec['sid']}>" + " tok" * (self.n - 1)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length",
                                      "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        body: dict[str, Any] = {
            "id": f"cmpl-{rec['sid']}", "model": st.args.model, "created": st.created,
            "object": "chat.completion" if self.chat else "text_completion",
            "choices": [choice], "usage": json.loads(self._usage()),
            "srv_arr_ns": rec["arr_ns"], "srv_ns": stamp,
        }
        if kv:
            body["kv_transfer_params"] = {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": f"synthetic-{st.args.name}", "remote_block_ids": [[0]],
                "remote_request_id": rec["xrid"] or str(rec["sid"]),
                "remote_host": "127.0.0.1", "remote_port": 0, "tp_size": 1}
        self.conn.write(response(200, json.dumps(body).encode(), self.conn.keep_alive))
        rec["first_ns"] = rec["last_ns"] = stamp
        rec["sent"] = self.n
        self.finish()

    def finish(self) -> None:
        self.rec["done"] = True
        self.handle = None
        self.conn.reply_done()

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.rec["closed_ns"] = now_ns()


class Connection(asyncio.Protocol):
    """One client connection: parse requests with httptools, one reply at a time."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.arr_ns = 0
        self.keep_alive = True
        self.active: Reply | None = None
        self.queued: list[tuple[bytes, bytes, dict[bytes, bytes], bytes, int, bool]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.write(response(400, b'{"error":"bad request"}', keep_alive=False))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.active is not None:
            self.active.cancel()
            self.active = None

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.arr_ns = now_ns()
        self.url, self.headers, self.body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        request = (self.parser.get_method(), self.url.split(b"?", 1)[0], self.headers,
                   b"".join(self.body), self.arr_ns, self.parser.should_keep_alive())
        if self.active is None:
            self.handle(*request)
        else:
            self.queued.append(request)

    def reply_done(self) -> None:
        self.active = None
        if not self.keep_alive:
            self.close()
        elif self.queued:
            self.handle(*self.queued.pop(0))

    def handle(self, method: bytes, path: bytes, headers: dict[bytes, bytes], body: bytes,
               arr_ns: int, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        if method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
            self.generate(path, headers, body, arr_ns)
            return
        st = self.state
        if method == b"GET" and path == b"/health":
            out = response(200, b"{}", keep_alive)
        elif method == b"GET" and path == b"/v1/models":
            out = response(200, st.models(), keep_alive)
        elif method == b"GET" and path == b"/stats":
            stats = {"name": st.args.name, "pid": os.getpid(), "requests": st.requests,
                     "records": st.records}
            out = response(200, json.dumps(stats).encode(), keep_alive)
        elif method == b"POST" and path == b"/reset":
            st.records.clear()
            st.requests = 0
            out = response(200, b'{"ok":true}', keep_alive)
        else:
            out = response(404, b'{"error":"not found"}', keep_alive)
        self.write(out)
        if not keep_alive:
            self.close()

    def generate(self, path: bytes, headers: dict[bytes, bytes], body: bytes,
                 arr_ns: int) -> None:
        st = self.state
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError:
            self.write(response(400, b'{"error":"body is not a JSON object"}', self.keep_alive))
            return
        n = req.get("max_tokens") or req.get("max_completion_tokens") or st.args.tokens
        n = max(1, min(int(n), 100_000))
        chat = path == b"/v1/chat/completions"
        prompt = req.get("messages") if chat else req.get("prompt")
        st.requests += 1
        xrid = headers.get(b"x-request-id")
        kv_in = req.get("kv_transfer_params")
        rec: dict[str, Any] = {
            "sid": st.requests, "path": path.decode(), "xrid": xrid.decode() if xrid else None,
            "stream": bool(req.get("stream")), "n": n, "kv_in": kv_in, "arr_ns": arr_ns,
            "first_ns": None, "last_ns": None, "sent": 0, "done": False, "closed_ns": None,
            "prompt_tokens": len(json.dumps(prompt)) // 4 + 1,
            "opening": json.dumps(prompt)[:24],  # which prefix, for a router's hit share
        }
        if len(st.records) < MAX_RECORDS:
            st.records.append(rec)
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        self.active = Reply(self, rec, n, chat, usage)
        wants_kv = isinstance(kv_in, dict) and bool(kv_in.get("do_remote_decode"))
        self.active.start(rec["stream"], wants_kv)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--name", default="upstream")
    return ap.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    state = State(args)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(state), "127.0.0.1", args.port,
                                      backlog=4096, reuse_address=True)
    print(f"[{args.name}] listening on 127.0.0.1:{args.port} pid={os.getpid()} "
          f"ttft={args.ttft_ms}ms itl={args.itl_ms}ms tokens={args.tokens}",
          file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a kvlab dependency on Linux
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve(args))


if __name__ == "__main__":
    main()
