"""A 10,000-request soak through `kvlab proxy` at concurrency 64: 0 lost, 0 hung.

The proxy runs as the command a person would run (its own process, uvloop); the engines are
the fast synthetic upstream of the benchmarks (4 tokens, 1 ms apart) so the soak exercises
the proxy, not the fakes. Every request must come back 200 with all its chunks and the end
marker, within a per-request deadline; both engines must have seen every request, and the
proxy's own counters must agree. Ctrl-C then stops the proxy cleanly.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from children import running, spawn, stop
from kvlab.engines.ports import free_port

BENCH = Path(__file__).parents[3] / "benchmarks" / "synthetic_upstream.py"
REQUESTS = 10_000
CONCURRENCY = 64
TOKENS = 4


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        try:
            if httpx.get(url, timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout} s")


@pytest.fixture
def engines() -> Iterator[tuple[int, int]]:
    ports = free_port(), free_port()
    procs = [spawn([sys.executable, str(BENCH), "--port", str(p), "--ttft-ms", "1",
                    "--itl-ms", "1", "--tokens", str(TOKENS), "--name", name],
                   stderr=subprocess.DEVNULL)
             for p, name in zip(ports, ("prefill", "decode"), strict=True)]
    try:
        for port, proc in zip(ports, procs, strict=True):
            _wait(f"http://127.0.0.1:{port}/health", proc)
        yield ports
    finally:
        for proc in procs:
            stop(proc, None)


async def _one(session: aiohttp.ClientSession, url: str, i: int) -> str:
    body = {"model": "fake-model", "prompt": f"soak {i}", "max_tokens": TOKENS, "stream": True}
    try:
        async with session.post(url, json=body) as reply:
            raw = await reply.read()
    except TimeoutError:
        return "hung"
    except aiohttp.ClientError as exc:
        return f"lost: {exc!r}"
    if reply.status != 200:
        return f"lost: status {reply.status}"
    if raw.count(b'"srv_i"') != TOKENS or not raw.endswith(b"data: [DONE]\n\n"):
        return f"lost: incomplete body {raw[-80:]!r}"
    return "ok"


async def _soak(url: str) -> dict[str, int]:
    results: dict[str, int] = {}
    queue = iter(range(REQUESTS))
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async def worker() -> None:
            for i in queue:
                outcome = await _one(session, url, i)
                key = outcome if outcome in ("ok", "hung") else "lost"
                results[key] = results.get(key, 0) + 1
                if key == "lost" and results[key] == 1:
                    results["first_loss: " + outcome] = 1

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return results


def _upstream_stats(port: int) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads(httpx.get(f"http://127.0.0.1:{port}/stats", timeout=30,
                                                 trust_env=False).text)
    return stats


def test_ten_thousand_requests_at_concurrency_64(engines: tuple[int, int],
                                                 tmp_path: Path) -> None:
    prefill, decode = engines
    port = free_port()
    with (tmp_path / "proxy.log").open("wb") as log:
        proxy = spawn([sys.executable, "-m", "kvlab", "proxy", "--prefill",
                       f"127.0.0.1:{prefill}", "--decode", f"127.0.0.1:{decode}",
                       "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/health", proxy)
        # the proxy's start-up check sends each leg its fingerprint probe: count from here
        before = {p: _upstream_stats(p)["requests"] for p in (prefill, decode)}
        started = time.monotonic()
        results = asyncio.run(_soak(f"http://127.0.0.1:{port}/v1/completions"))
        took = time.monotonic() - started
        exposition = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
    finally:
        code = stop(proxy, signal.SIGINT)
    assert results == {"ok": REQUESTS}, results
    assert 'kvlab_proxy_requests_total{leg="",outcome="ok"} 10000.0' in exposition
    for port_ in (prefill, decode):
        stats = _upstream_stats(port_)
        assert stats["requests"] - before[port_] == REQUESTS
        assert all(r["done"] for r in stats["records"])
    assert code == 130, (tmp_path / "proxy.log").read_text()[-2000:]
    print(f"soak: {REQUESTS} requests at concurrency {CONCURRENCY} in {took:.1f} s")


def test_sigterm_stops_the_proxy_cleanly(engines: tuple[int, int], tmp_path: Path) -> None:
    prefill, decode = engines
    port = free_port()
    head: list[str] = []
    with running([sys.executable, "-m", "kvlab", "proxy", "--prefill", f"127.0.0.1:{prefill}",
                  "--decode", f"127.0.0.1:{decode}", "--port", str(port)],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proxy:
        try:
            assert proxy.stdout is not None
            # the ready line, not /health: one worker answers before every worker listens
            while not (head and head[-1].startswith("==> ready: http://127.0.0.1:")):
                line = proxy.stdout.readline()
                assert line, f"the proxy exited with {proxy.wait(10)}"
                head.append(line)
            body = {"model": "fake-model", "prompt": "x", "max_tokens": 2}
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body,
                               trust_env=False)
        finally:
            proxy.send_signal(signal.SIGTERM)
            out, err = proxy.communicate(timeout=30)
    assert reply.status_code == 200
    assert proxy.returncode == 0, err
    assert out.rstrip().endswith("==> stopped")
