"""The proxy's HTTP front against oversized, odd and pipelined requests (issue 14, 1/3/4/7/8).

All against `kvlab proxy --workers 1` in front of two synthetic engines, on raw sockets, as
the audit did: an endless header is cut at its limit (431) with the worker's memory flat; a
request line, a header line, the header count and the whole head each have their status
(414 / 431 / 431 / 400) naming the setting; Upgrade and CONNECT get a 4xx, not a traceback;
a bad request pipelined behind a good one leaves the good one whole; error bodies never echo
the URL; an HTTP/1.0 client gets a stream it can read (no chunked coding).
"""

from __future__ import annotations

import json
import select
import socket
import time

import psutil

from adversarial.wire import (
    ProxyProcess,
    ask,
    connect,
    generation,
    no_traceback,
    read_all,
    replies,
    send,
)

MIB = 2**20


def _error(reply_body: bytes) -> dict[str, object]:
    err = json.loads(reply_body)["error"]
    assert isinstance(err, dict)
    return err


def _stream_until_answered(sock: socket.socket, first: bytes, limit: int,
                           within_s: float = 10.0) -> tuple[int, bytes]:
    """Send `first`, then filler until the proxy answers (or `limit` bytes, or time)."""
    sock.settimeout(5)
    sock.sendall(first)
    sent, chunk = 0, b"a" * 65536
    deadline = time.monotonic() + within_s
    while sent < limit and time.monotonic() < deadline:
        if select.select([sock], [], [], 0)[0]:
            break
        try:
            sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            break
        sent += len(chunk)
    return sent, read_all(sock, 5)


def test_an_endless_header_is_cut_at_its_limit(front: ProxyProcess) -> None:
    worker = psutil.Process(front.proc.pid)
    before = worker.memory_info().rss
    with connect(front.port) as sock:
        sent, got = _stream_until_answered(
            sock, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-endless: ", 64 * MIB)
    (reply,) = replies(got)
    assert reply.status == 431, got[:300]
    assert "PROXY_MAX_HEADER_BYTES" in str(_error(reply.body)["message"])
    assert sent < 4 * MIB, f"the proxy read {sent} bytes of one header before answering"
    assert worker.memory_info().rss - before < 20 * MIB
    no_traceback(front)


def test_each_head_limit_has_its_status(front: ProxyProcess) -> None:
    heads = {
        414: b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nhost: x\r\n\r\n",
        431: b"GET /health HTTP/1.1\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(101))
             + b"\r\n",
        400: b"GET /health HTTP/1.1\r\n" + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 4000)
                                                   for i in range(20)) + b"\r\n",
    }
    settings = {414: "PROXY_MAX_REQUEST_LINE_BYTES", 431: "PROXY_MAX_HEADERS",
                400: "PROXY_MAX_HEAD_BYTES"}
    for status, head in heads.items():
        (reply,) = replies(send(front.port, head))
        assert reply.status == status, reply
        assert settings[status] in str(_error(reply.body)["message"])
        assert reply.headers["connection"] == "close"
    long_line = b"GET /health HTTP/1.1\r\nx-big: " + b"b" * 9000 + b"\r\n\r\n"
    (reply,) = replies(send(front.port, long_line))
    assert reply.status == 431 and b"PROXY_MAX_HEADER_BYTES" in reply.body
    fine = b"GET /health HTTP/1.1\r\n" + b"x-ok: " + b"v" * 8000 + b"\r\n\r\n"
    assert ask(front.port, fine).status == 200
    no_traceback(front)


def test_upgrade_and_connect_get_a_4xx(front: ProxyProcess) -> None:
    upgrade = (b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\n"
               b"upgrade: websocket\r\n\r\n")
    (reply,) = replies(send(front.port, upgrade))
    assert reply.status == 400 and b"Upgrade" in reply.body
    (reply,) = replies(send(front.port, b"CONNECT example.com:443 HTTP/1.1\r\n"
                                        b"host: example.com:443\r\n\r\n"))
    assert reply.status == 405 and reply.headers["allow"] == "GET, POST"
    no_traceback(front)


def test_a_bad_request_behind_a_good_one_leaves_it_whole(front: ProxyProcess) -> None:
    ok = front.count("kvlab_proxy_requests", outcome="ok", leg="")
    aborted = front.count("kvlab_proxy_aborts", stage="prefill")
    for bad in (b"\x00GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nconnection: upgrade\r\n"
                                        b"upgrade: h2c\r\n\r\n"):
        got = send(front.port, generation() + generation() + bad)
        first, second, refused = replies(got)
        for good in (first, second):
            assert good.status == 200 and good.body.endswith(b"data: [DONE]\n\n")
            assert good.body.count(b'"srv_i"') == 4
        assert refused.status == 400 and refused.headers["connection"] == "close"
    assert front.count("kvlab_proxy_requests", outcome="ok", leg="") == ok + 4
    assert front.count("kvlab_proxy_aborts", stage="prefill") == aborted
    no_traceback(front)


def test_error_bodies_never_echo_the_url(front: ProxyProcess) -> None:
    reply = ask(front.port, b"GET /" + b"u" * 8000 + b" HTTP/1.1\r\n\r\n")
    assert reply.status == 404 and len(reply.body) < 500, len(reply.body)
    assert "(8001 bytes)" in str(_error(reply.body)["message"])
    with connect(front.port) as sock:
        _, got = _stream_until_answered(sock, b"GET /", 8 * MIB)
    (reply,) = replies(got)
    assert reply.status == 414 and len(reply.body) < 500


def test_http10_clients_get_a_stream_they_can_read(front: ProxyProcess) -> None:
    started = time.monotonic()
    got = send(front.port, generation(version=b"1.0"), within_s=10)
    took = time.monotonic() - started
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode().lower().split("\r\n")
    assert lines[0].startswith("http/1.1 200")
    assert "connection: close" in lines
    assert not any(line.startswith("transfer-encoding") for line in lines), head
    assert body.startswith(b"data: ") and body.endswith(b"data: [DONE]\n\n")
    assert body.count(b'"srv_i"') == 4
    assert took < 5, "the proxy did not end the body by closing the connection"
    whole = send(front.port, generation(version=b"1.0", body=GOOD_WHOLE), within_s=10)
    (reply,) = replies(whole)
    assert reply.status == 200 and "content-length" in reply.headers


GOOD_WHOLE = b'{"model":"fake-model","prompt":"hello","max_tokens":4}'
