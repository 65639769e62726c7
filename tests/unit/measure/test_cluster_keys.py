"""Engines on a cluster require a key, and every client kvlab runs against them sends it: the
reuse and prove steps the shared and offload labs run, whose probes once asked /v1/models
without it (a keyed engine answered 401 and the lab stopped there)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from kvlab.measure.prove import ProveOptions, run_proof
from kvlab.measure.reuse import ReuseOptions, run_reuse

KEY = "cluster-run-key-271828"


class _Keyed(BaseHTTPRequestHandler):
    """An engine that guards /v1 with a key, as vLLM's VLLM_API_KEY does, and knows nothing
    else: what matters is what its first request carried."""

    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {KEY}":
            self._send(401, {"error": "Unauthorized"})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": "local-chat", "max_model_len": 4096}]})
        else:
            self._send(404, {})

    do_POST = do_GET

    def _send(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def keyed() -> Iterator[str]:
    _Keyed.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Keyed)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


async def test_reuse_and_prove_ask_a_keyed_engine_with_its_key(keyed: str) -> None:
    steps = (lambda: run_reuse(ReuseOptions([keyed], "local-chat", api_key=KEY, timeout_s=5)),
             lambda: run_proof(ProveOptions([keyed, keyed + "/"], "local-chat", api_key=KEY,
                                        timeout_s=5)))
    for step in steps:
        _Keyed.seen.clear()
        with pytest.raises(Exception):  # noqa: B017 - the fake answers nothing past /v1/models
            await asyncio.wait_for(step(), 30)
        models = [auth for path, auth in _Keyed.seen if path == "/v1/models"]
        assert models and set(models) == {f"Bearer {KEY}"}, _Keyed.seen
