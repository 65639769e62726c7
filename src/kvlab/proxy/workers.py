"""Several proxy processes on one port: a supervisor and its workers (PROXY_WORKERS).

One Python process relays every chunk of every stream on one event loop; when that loop is
busy, a new request waits for it. Measured with `benchmarks/proxy_overhead.py` on two
cores, a second process cut the overhead at concurrency 256 from about 23 ms to about 4 ms
(p50) and took concurrency 64 under 1 ms. So `kvlab proxy` runs `workers` processes:

- The supervisor (this process) checks the legs once, reserves the port (port 0 becomes a
  real one), starts the workers and reports ready when every one of them listens.
- Each worker is a fresh interpreter (spawn: nothing inherited but its config) that binds
  the same port with SO_REUSEPORT, so the kernel spreads client connections among them,
  and serves exactly as a single proxy would.
- /metrics is the sum over all workers: each writes prometheus_client's multiprocess files
  in a private directory the supervisor removes at exit. Choosing between repeated legs
  (round-robin, least-outstanding) is done by each worker over its own requests.
- SIGTERM or Ctrl-C stops every worker, as does a worker stopping cleanly (a SIGTERM sent
  to the whole group). A worker that dies takes the others down and the supervisor exits
  with an error: a port that fails some clients at random is worse than one that is
  plainly gone. A worker whose supervisor vanished stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType

from kvlab.core import PROXY_METRICS_PREFIX, EngineError
from kvlab.engines import client_host
from kvlab.proxy.app import loop_runner, serve
from kvlab.proxy.config import ProxyConfig
from kvlab.proxy.metrics import MULTIPROC_ENV

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
OnReady = Callable[[str, object], None]  # (the proxy's URL, what the leg check returned)


class _Stop(BaseException):
    """SIGTERM: stop serving. Raised from the signal handler, like KeyboardInterrupt, so
    it ends whatever the supervisor is doing, start-up included."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


SPREADING_SYSTEMS = ("linux",)  # where SO_REUSEPORT spreads connections among processes


def spread_note(workers: int, system: str = sys.platform) -> str:
    """Why several workers would not help here ("" where the kernel spreads connections):
    on macOS and the BSDs SO_REUSEPORT hands every new connection to one socket."""
    if workers <= 1 or system.startswith(SPREADING_SYSTEMS):
        return ""
    return (f"PROXY_WORKERS={workers} ignored: on {system} SO_REUSEPORT does not spread "
            "connections among processes (measured on Linux only), so one worker serves")


def serve_workers(config: ProxyConfig, on_ready: OnReady) -> None:
    """Check the legs, start `config.workers` workers, serve until SIGTERM or Ctrl-C."""
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    # 0700: only us; the PID in the name lets `kvlab clean` remove it if we are killed
    metrics_dir = tempfile.mkdtemp(prefix=f"{PROXY_METRICS_PREFIX}{os.getpid()}-")
    workers: list[tuple[BaseProcess, Connection]] = []
    reserved: socket.socket | None = None
    try:
        with loop_runner() as runner:
            agreement = runner.run(config.check_legs())
        reserved = reserve_port(config.host, config.port)
        port = reserved.getsockname()[1]
        _start(replace(config, port=port, compat=None), metrics_dir, workers)
        _await_ready(workers)
        reserved.close()
        on_ready(f"http://{client_host(config.host)}:{port}", agreement)
        _supervise(workers)
    except _Stop:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
        if reserved is not None:
            reserved.close()
        _stop(workers)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening, SO_REUSEPORT socket: it holds the port for the workers.

    A socket that never listens receives no connections, so no client lands here."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise EngineError(f"SERVE_HOST={host!r}: cannot listen there ({exc})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise EngineError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
                          "choose another PROXY_PORT or stop what holds it") from None
    return sock


def _start(config: ProxyConfig, metrics_dir: str,
           workers: list[tuple[BaseProcess, Connection]]) -> None:
    """Start the workers, adding each to `workers` as it starts (so a failure stops them)."""
    spawn = get_context("spawn")
    before = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = metrics_dir  # read by prometheus_client when a worker imports it
    try:
        for i in range(config.workers):
            ours, theirs = spawn.Pipe()
            proc = spawn.Process(target=worker_main, args=(config, theirs),
                                 name=f"kvlab-proxy-worker-{i}")
            proc.start()
            theirs.close()
            workers.append((proc, ours))
    finally:
        if before is None:
            del os.environ[MULTIPROC_ENV]
        else:
            os.environ[MULTIPROC_ENV] = before


def _await_ready(workers: list[tuple[BaseProcess, Connection]]) -> None:
    waiting = {id(chan): (proc, chan) for proc, chan in workers}
    deadline = time.monotonic() + START_TIMEOUT_S
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise EngineError(f"{len(waiting)} proxy worker(s) did not start within "
                              f"{START_TIMEOUT_S:g} s")
        chans = [chan for _, chan in waiting.values()]
        ready = wait([*chans, *(proc.sentinel for proc, _ in waiting.values())], timeout=left)
        for proc, chan in list(waiting.values()):
            if chan in ready:
                try:
                    status, detail = chan.recv()
                except EOFError:
                    proc.join(5)
                    status, detail = "failed", f"it exited with code {proc.exitcode}"
                if status != "ready":
                    raise EngineError(f"proxy worker {proc.name} failed to start: {detail}")
                del waiting[id(chan)]
            elif proc.sentinel in ready:
                proc.join(5)
                raise EngineError(f"proxy worker {proc.name} exited with code {proc.exitcode} "
                                  "while starting")


def _supervise(workers: list[tuple[BaseProcess, Connection]]) -> None:
    """Until SIGTERM (_Stop), Ctrl-C (KeyboardInterrupt) or a worker's exit."""
    sentinels = {proc.sentinel: proc for proc, _ in workers}
    while True:
        for sentinel in wait(list(sentinels)):
            proc = sentinels[sentinel]  # type: ignore[index]
            proc.join(5)
            if proc.exitcode == 0:
                return  # it was told to stop (a SIGTERM to the group, say): stop them all
            raise EngineError(f"proxy worker {proc.name} exited with code {proc.exitcode}; "
                              "the other workers were stopped")


def _stop(workers: list[tuple[BaseProcess, Connection]]) -> None:
    for proc, chan in workers:
        chan.close()  # a worker also stops when its channel closes
        if proc.is_alive():
            proc.terminate()
    for proc, _ in workers:
        proc.join(STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


# --- the worker side --------------------------------------------------------------------
def worker_main(config: ProxyConfig, channel: Connection) -> None:
    """One worker: serve `config` until SIGTERM or the supervisor's channel closes."""
    # Ctrl-C reaches the whole process group; the supervisor decides when workers stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        with loop_runner() as runner:
            runner.run(_worker(config, channel))
    except Exception as exc:  # reported to the supervisor, which shows it in one line
        with contextlib.suppress(OSError):
            channel.send(("failed", str(exc) or type(exc).__name__))
        sys.exit(1)


async def _worker(config: ProxyConfig, channel: Connection) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(channel.fileno(), stop.set)  # the supervisor closed it or went away
    await serve(config, lambda app: channel.send(("ready", app.port)), stop, worker=True)
