"""GET /health on one keep-alive connection every 20 ms for a while; print the latencies.

Run as its own process by the fuzz test, so the attackers' event loop (in the test process)
cannot delay the measurement: `python probe.py PORT SECONDS` prints a JSON list of
seconds per request, or {"error": ...} if the proxy stopped answering.
"""

from __future__ import annotations

import json
import socket
import sys
import time

REQUEST = b"GET /health HTTP/1.1\r\nhost: probe\r\n\r\n"


def one(sock: socket.socket) -> None:
    """Send one request and read its whole reply (content-length framed)."""
    sock.sendall(REQUEST)
    got = b""
    while b"\r\n\r\n" not in got:
        piece = sock.recv(65536)
        if not piece:
            raise ConnectionError("closed by the proxy")
        got += piece
    head, _, body = got.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(f"answered {head[:40]!r}")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            raise ConnectionError("closed mid-reply")
        body += piece


def main(port: int, seconds: float) -> None:
    took: list[float] = []
    deadline = time.monotonic() + seconds
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while time.monotonic() < deadline:
                started = time.perf_counter()
                one(sock)
                took.append(time.perf_counter() - started)
                time.sleep(0.02)
    except OSError as exc:
        print(json.dumps({"error": repr(exc), "done": len(took)}))
        return
    print(json.dumps(took))


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
