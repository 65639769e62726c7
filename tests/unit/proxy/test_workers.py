"""`kvlab proxy` with several worker processes: real processes, real sockets, fake engines.

The workers share one port; /metrics must be the sum over all of them; Ctrl-C and SIGTERM
stop every worker and remove the metrics directory; a worker that dies stops the proxy
with one line; a port already taken is refused with one line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import psutil
import pytest

from children import async_running
from fakes.fault_upstream import Behaviour, FaultUpstream
from kvlab.engines.ports import free_port
from kvlab.observe import metrics

BODY = {"model": "fake-model", "prompt": "hello", "max_tokens": 4}
START_S = 60.0


class Proxy:
    def __init__(self, proc: asyncio.subprocess.Process, url: str, tmp: Path) -> None:
        self.proc, self.url, self.tmp = proc, url, tmp

    def workers(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                if "spawn_main" in " ".join(p.cmdline())]

    def metrics_dirs(self) -> list[Path]:
        return sorted(self.tmp.glob("kvlab-proxy-metrics-*"))

    async def wait(self) -> tuple[int, str]:
        code = await asyncio.wait_for(self.proc.wait(), 30)
        assert self.proc.stderr is not None
        return code, (await self.proc.stderr.read()).decode()


@asynccontextmanager
async def proxy_process(tmp: Path, *extra: str, decode_as: Behaviour | None = None
                        ) -> AsyncIterator[Proxy]:
    """`kvlab proxy --workers 2` in its own session, ready (both workers listening)."""
    async with FaultUpstream() as prefill, FaultUpstream() as decode:
        decode.behaviour = decode_as or decode.behaviour
        port = free_port()
        env = {**os.environ, "TMPDIR": str(tmp)}
        async with async_running(
                sys.executable, "-m", "kvlab", "proxy", "--prefill", prefill.url, "--decode",
                decode.url, "--port", str(port), "--workers", "2", *extra,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
            proxy = Proxy(proc, f"http://127.0.0.1:{port}", tmp)
            await asyncio.wait_for(_ready(proxy), START_S)
            yield proxy


async def _ready(proxy: Proxy) -> None:
    out, err = proxy.proc.stdout, proxy.proc.stderr
    assert out is not None and err is not None
    line = b""
    while b"==> ready" not in line:
        line = await out.readline()
        if not line:
            raise AssertionError((await err.read()).decode())


async def test_two_workers_share_the_port_and_metrics_add_up(tmp_path: Path) -> None:
    async with proxy_process(tmp_path) as proxy:
        assert len(proxy.workers()) == 2
        dirs, live = leftovers(tmp_path)  # the probe the stop tests rely on sees them all
        assert len(dirs) == 1 and {proxy.proc.pid, *(w.pid for w in proxy.workers())} <= set(live)
        # a new connection per request: the kernel spreads connections, not requests
        for _ in range(16):
            async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
                reply = await c.post(proxy.url + "/v1/completions", json=BODY)
                assert reply.status_code == 200, reply.text
        (shared,) = proxy.metrics_dirs()
        assert (shared.stat().st_mode & 0o777) == 0o700
        writers = {f.stem.rsplit("_", 1)[1] for f in shared.glob("counter_*.db")}
        assert writers == {str(p.pid) for p in proxy.workers()}, "one worker got every client"
        async with httpx.AsyncClient(trust_env=False) as c:
            snap = await metrics.scrape(c, proxy.url + "/metrics")
        assert snap is not None
        assert snap.total("kvlab_proxy_requests", {"outcome": "ok", "leg": ""}) == 16
        assert snap.total("kvlab_proxy_outstanding", {"leg": "decode"}) == 0
        proxy.proc.send_signal(signal.SIGTERM)
        code, err = await proxy.wait()
        assert code == 0, err
        assert await settled(tmp_path) == ([], [])


async def test_sigterm_while_starting_stops_cleanly(tmp_path: Path) -> None:
    async with FaultUpstream() as prefill, FaultUpstream() as decode, async_running(
            sys.executable, "-m", "kvlab", "proxy", "--prefill", prefill.url, "--decode",
            decode.url, "--port", str(free_port()), "--workers", "2",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "TMPDIR": str(tmp_path)}) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert b"Checking the engines" in await proc.stdout.readline()
        await asyncio.sleep(0.3)  # the check, the port, the workers: somewhere in start-up
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        err = (await proc.stderr.read()).decode()
        left = await settled(tmp_path)  # before the cleanup stops what the proxy left
    assert code == 0, err
    assert left == ([], [])


async def settled(tmp: Path, within_s: float = 3.0) -> tuple[list[Path], list[int]]:
    """`leftovers`, once they are gone or `within_s` has passed (helpers exit on EOF)."""
    for _ in range(int(within_s / 0.1)):
        found = leftovers(tmp)
        if found == ([], []):
            break
        await asyncio.sleep(0.1)
    return found


def leftovers(tmp: Path) -> tuple[list[Path], list[int]]:
    """Metrics directories and live processes of the proxy started with TMPDIR=tmp."""
    live = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TMPDIR") == str(tmp) and proc.status() != "zombie":
                live.append(proc.pid)
        except psutil.Error:
            continue
    return sorted(tmp.glob("kvlab-proxy-metrics-*")), live


async def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    async with proxy_process(tmp_path) as proxy:
        workers = proxy.workers()
        os.killpg(proxy.proc.pid, signal.SIGINT)  # as a terminal does: the whole group
        code, err = await proxy.wait()
        assert code == 130, err
        assert "Traceback" not in err
        assert not [w for w in workers if w.is_running() and w.status() != "zombie"]
        assert proxy.metrics_dirs() == []


async def test_a_dead_worker_stops_the_proxy_in_one_line(tmp_path: Path) -> None:
    async with proxy_process(tmp_path) as proxy:
        first, second = proxy.workers()
        first.kill()
        code, err = await proxy.wait()
        assert code == 2
        (line,) = err.strip().splitlines()
        assert line.startswith("kvlab: proxy worker kvlab-proxy-worker-")
        assert "exited with code -9; the other workers were stopped" in line
        await asyncio.to_thread(psutil.wait_procs, [second], 10)
        assert not second.is_running() or second.status() == "zombie"


async def test_a_taken_port_is_refused_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        async with FaultUpstream() as prefill, FaultUpstream() as decode, async_running(
                sys.executable, "-m", "kvlab", "proxy", "--prefill", prefill.url, "--decode",
                decode.url, "--port", str(port), "--workers", "2",
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
            _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    (line,) = err.decode().strip().splitlines()
    assert line.startswith(f"kvlab: cannot listen on 127.0.0.1:{port}")
    assert "PROXY_PORT" in line


async def test_engines_that_disagree_are_refused_unless_ignored(tmp_path: Path) -> None:
    other = Behaviour(version="0.0.1-other")
    with pytest.raises(AssertionError) as refused:
        async with proxy_process(tmp_path, decode_as=other):
            pass
    (line,) = str(refused.value).strip().splitlines()
    assert line.startswith("kvlab: instances disagree on version:")
    async with (proxy_process(tmp_path, "--ignore", "version", decode_as=other) as proxy,
                httpx.AsyncClient(trust_env=False, timeout=10) as c):
        assert (await c.post(proxy.url + "/v1/completions", json=BODY)).status_code == 200


@pytest.mark.parametrize("workers", ["0", "65"])
def test_worker_count_is_checked(workers: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kvlab", "proxy", "--workers", workers],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--workers" in done.stderr
