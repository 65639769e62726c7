"""Loopback ports for engines: whether one is taken, and a free one never handed out twice.

An engine's plan names its port before the engine binds it, so `free_port` remembers every
port it gave in this process: the kernel can give the same free port twice in a row.

Deliberately not here: starting the engine that binds the port (`process.py`) and finding what
listens on a port (`strays.py` for kvlab's own engines, `local.py` for any).
"""

from __future__ import annotations

import socket
import threading

from kvlab.core import EngineError


def port_in_use(host: str, port: int) -> bool:
    """Whether something already accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


_GIVEN: set[int] = set()  # ports free_port handed out in this process
_GIVEN_LOCK = threading.Lock()


def free_port() -> int:
    """A port the kernel says is free right now on loopback, and one this process has not
    handed out before: plans are made before their engines bind, and the kernel can give
    the same free port twice in a row (two engines of one run then shared one port, and each
    one's readiness probe was answered by the other)."""
    with _GIVEN_LOCK:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port
    raise EngineError("no free loopback port this process has not used already")
