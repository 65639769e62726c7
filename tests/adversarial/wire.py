"""Tools of the adversarial tier: the proxy as a person runs it, and raw bytes against it.

`upstreams()` starts the benchmarks' synthetic engine twice (prefill, decode);
`proxy_process()` starts `kvlab proxy --workers 1` in front of them, in its own session
(`children`: the signals at their defaults), with its settings from a clean environment and
its output in a log file; `send()` writes
raw bytes on a fresh connection and reads until the proxy closes it (or a deadline);
`ask()` reads only the first reply; `replies()` parses what came back into (status, headers,
body).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httptools
import httpx

from children import spawn, stop
from kvlab.core.settings import Settings
from kvlab.engines.ports import free_port
from kvlab.observe import metrics

BENCH = Path(__file__).parents[2] / "benchmarks" / "synthetic_upstream.py"
START_S = 60.0
GOOD = (b'{"model":"fake-model","prompt":"hello","max_tokens":4,"stream":true}')


def generation(body: bytes = GOOD, version: bytes = b"1.1", extra: bytes = b"") -> bytes:
    return (b"POST /v1/completions HTTP/%s\r\nhost: proxy\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n%s\r\n%s" % (version, len(body), extra, body))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment less every kvlab setting (KVLAB_HOME kept), plus `extra`."""
    names = {n.upper() for n in Settings.model_fields if n != "kvlab_home"}
    env = {k: v for k, v in os.environ.items() if k.upper() not in names}
    return {**env, **extra}


@dataclass
class Upstreams:
    prefill: int
    decode: int


@contextmanager
def upstreams(tokens: int = 4) -> Iterator[Upstreams]:
    ports = free_port(), free_port()
    procs = [spawn([sys.executable, str(BENCH), "--port", str(p), "--ttft-ms", "1",
                    "--itl-ms", "1", "--tokens", str(tokens), "--name", name],
                   stderr=subprocess.DEVNULL)
             for p, name in zip(ports, ("prefill", "decode"), strict=True)]
    try:
        for port, proc in zip(ports, procs, strict=True):
            _until(partial(_answers, f"http://127.0.0.1:{port}/health"), proc, "upstream")
        yield Upstreams(*ports)
    finally:
        for proc in procs:
            stop(proc, None)


@dataclass
class ProxyProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    seen: int = field(default=0)  # log characters already checked for tracebacks

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def scrape(self) -> metrics.Snapshot:
        with httpx.Client(trust_env=False, timeout=10) as client:
            snap = metrics.parse(client.get(self.url + "/metrics").text)
        return snap

    def count(self, name: str, **labels: str) -> float:
        return self.scrape().total(name, labels) or 0.0


@contextmanager
def proxy_process(ups: Upstreams, tmp: Path, *args: str, env: dict[str, str] | None = None,
                  preexec: Callable[[], None] | None = None) -> Iterator[ProxyProcess]:
    """`kvlab proxy --workers 1` (plus `args`), ready; stopped afterwards."""
    port = free_port()
    log = tmp / f"proxy-{port}.log"
    argv = [sys.executable, "-m", "kvlab", "proxy", "--prefill", f"127.0.0.1:{ups.prefill}",
            "--decode", f"127.0.0.1:{ups.decode}", "--port", str(port), "--workers", "1",
            *args]
    with open(log, "wb") as out:
        proc = spawn(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp,
                     env=clean_env(**(env or {})), preexec=preexec)
    proxy = ProxyProcess(proc, port, log)
    try:
        _until(lambda: "==> ready" in proxy.log_text(), proc, "kvlab proxy", proxy.log)
        yield proxy
    finally:
        stop(proc, None)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _until(ready: Callable[[], bool], proc: subprocess.Popen[bytes], name: str,
           log: Path | None = None) -> None:
    deadline = time.monotonic() + START_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            shown = log.read_text(errors="replace")[-2000:] if log else ""
            raise AssertionError(f"{name} did not start ({proc.poll()}): {shown}")
        time.sleep(0.05)


def connect(port: int, rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    return sock


def send(port: int, data: bytes | list[bytes], within_s: float = 5.0) -> bytes:
    """Write `data` (pieces sent apart) on a new connection; read until closed or deadline."""
    with connect(port) as sock:
        for piece in [data] if isinstance(data, bytes) else data:
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        return read_all(sock, within_s)


def ask(port: int, data: bytes, within_s: float = 10.0) -> Reply:
    """Write `data` on a new connection; the first complete reply (the connection may
    stay open)."""
    with connect(port) as sock:
        sock.sendall(data)
        got = b""
        deadline = time.monotonic() + within_s
        while not (done := replies(got)):
            left = deadline - time.monotonic()
            assert left > 0, f"no complete reply within {within_s} s: {got[:300]!r}"
            sock.settimeout(left)
            piece = sock.recv(65536)
            assert piece, f"closed without a complete reply: {got[:300]!r}"
            got += piece
        return done[0]


def read_all(sock: socket.socket, within_s: float) -> bytes:
    """Everything until the peer closes, or what came before `within_s` passed."""
    got = []
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            piece = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not piece:
            break
        got.append(piece)
    return b"".join(got)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


class _Replies:
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[Reply] = []
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done.append(Reply(self.parser.get_status_code(), self.headers,
                               b"".join(self.body)))
        self.headers, self.body = {}, []


def replies(raw: bytes) -> list[Reply]:
    """The complete responses in `raw`, in order (a truncated last one is left out)."""
    parsing = _Replies()
    try:
        parsing.parser.feed_data(raw)
    except httptools.HttpParserError as exc:
        raise AssertionError(f"the proxy wrote broken HTTP: {exc}: {raw[:300]!r}") from None
    return parsing.done


def no_traceback(proxy: ProxyProcess) -> None:
    text = proxy.log_text()
    assert "Traceback" not in text, text[-3000:]
