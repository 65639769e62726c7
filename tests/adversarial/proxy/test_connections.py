"""Clients that hold connections without using them (issue 14, item 2).

Each test runs its own `kvlab proxy --workers 1` with the setting under test: silent and
half-sent connections are closed after PROXY_HEAD_TIMEOUT_S (408 when part of a request
came), idle keep-alive ones after PROXY_KEEPALIVE_TIMEOUT_S; past PROXY_MAX_CONNECTIONS a
client gets a 503 at once, one line is logged however many are refused, /metrics counts
them; the soft file limit is raised to the hard one, and a low hard limit lowers the cap
instead of leaving clients to connection resets.
"""

from __future__ import annotations

import resource
import select
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from adversarial.wire import (
    ProxyProcess,
    Reply,
    Upstreams,
    connect,
    no_traceback,
    proxy_process,
    read_all,
    replies,
    send,
)


def _closed_within(sock: socket.socket, within_s: float) -> bytes | None:
    """What the proxy sent before closing `sock`, or None if it is still open."""
    deadline = time.monotonic() + within_s
    got = b""
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.05)[0]:
            try:
                piece = sock.recv(65536)
            except ConnectionResetError:
                return got
            if not piece:
                return got
            got += piece
    return None


def test_silent_and_half_sent_connections_time_out(engines: Upstreams, tmp_path: Path) -> None:
    with (proxy_process(engines, tmp_path, env={"PROXY_HEAD_TIMEOUT_S": "1"}) as proxy,
          ExitStack() as stack):
        silent = [stack.enter_context(connect(proxy.port)) for _ in range(50)]
        half = stack.enter_context(connect(proxy.port))
        half.sendall(b"GET /health HTTP/1.1\r\nhost")
        slow_body = stack.enter_context(connect(proxy.port))
        slow_body.sendall(b"POST /v1/completions HTTP/1.1\r\ncontent-length: 10\r\n\r\n{")
        assert _closed_within(silent[0], 0.5) is None  # not before its time
        assert all(_closed_within(s, 3) == b"" for s in silent)
        for sock in (half, slow_body):
            got = _closed_within(sock, 3)
            assert got is not None
            (reply,) = replies(got)
            assert reply.status == 408 and b"PROXY_HEAD_TIMEOUT_S" in reply.body
        assert proxy.count("kvlab_proxy_client_timeouts", phase="head") == 51
        assert proxy.count("kvlab_proxy_client_timeouts", phase="body") == 1
        no_traceback(proxy)


def test_idle_keepalive_connections_are_closed(engines: Upstreams, tmp_path: Path) -> None:
    with proxy_process(engines, tmp_path, env={"PROXY_KEEPALIVE_TIMEOUT_S": "1"}) as proxy:
        with connect(proxy.port) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            first = _until_reply(sock)
            assert first.status == 200 and "connection" not in first.headers
            started = time.monotonic()
            assert _closed_within(sock, 4) == b""
            assert 0.5 < time.monotonic() - started < 3
        assert proxy.count("kvlab_proxy_client_timeouts", phase="idle") == 1


def _until_reply(sock: socket.socket) -> Reply:
    got = b""
    while not (done := replies(got)):
        got += sock.recv(65536)
    return done[0]


def test_the_connection_cap_answers_503_and_logs_once(engines: Upstreams,
                                                      tmp_path: Path) -> None:
    env = {"PROXY_MAX_CONNECTIONS": "20"}
    with proxy_process(engines, tmp_path, env=env) as proxy, ExitStack() as stack:
        held = [stack.enter_context(connect(proxy.port)) for _ in range(20)]
        time.sleep(0.3)  # accepted by the proxy, not just by the kernel
        refused = [send(proxy.port, b"", within_s=3) for _ in range(30)]
        for got in refused:
            (reply,) = replies(got)
            assert reply.status == 503 and b"PROXY_MAX_CONNECTIONS" in reply.body
        assert all(_closed_within(s, 0.05) is None for s in held)
        stack.close()
        time.sleep(0.3)
        assert proxy.count("kvlab_proxy_connections_refused", reason="cap") == 30
        lines = [ln for ln in proxy.log_text().splitlines() if "PROXY_MAX_CONNECTIONS" in ln]
        assert len(lines) == 1, lines
        no_traceback(proxy)


def _files(soft: int, hard: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return limit


def _soft_files(proxy: ProxyProcess) -> int:
    for line in Path(f"/proc/{proxy.proc.pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


def test_the_soft_file_limit_is_raised(engines: Upstreams, tmp_path: Path) -> None:
    with proxy_process(engines, tmp_path, preexec=_files(512, 2048)) as proxy:
        assert _soft_files(proxy) == 2048


def test_a_low_file_limit_lowers_the_cap_instead_of_resetting(engines: Upstreams,
                                                              tmp_path: Path) -> None:
    with (proxy_process(engines, tmp_path, preexec=_files(256, 256)) as proxy,
          ExitStack() as stack):
        socks = []
        for _ in range(300):
            socks.append(stack.enter_context(connect(proxy.port)))
        time.sleep(1.0)
        answered = [s for s in socks if select.select([s], [], [], 0)[0]]
        statuses = [r.status for s in answered for r in replies(read_all(s, 1))]
        assert len(socks) - len(answered) == 64  # held: the cap
        assert statuses == [503] * (300 - 64)
        assert "PROXY_MAX_CONNECTIONS=4096 lowered to 64" in proxy.log_text()
        stack.close()
        time.sleep(0.3)
        assert replies(send(proxy.port, b"GET /health HTTP/1.1\r\n\r\n", 2))[0].status == 200
        no_traceback(proxy)
