"""Every client connection of one proxy: their handler, limits, deadlines, cap and counts.

`Front` makes the connections (`protocol`), keeps the open ones, and once a second (or a
quarter of the shortest client timeout) closes those whose deadline passed and cuts off
those that left a response unread too long (`server.py` sets the deadlines). It counts what
happens to clients in the proxy's metrics and logs what can repeat per connection (the cap
hit, heads that never arrive) once, then at most once a minute.
"""

from __future__ import annotations

import asyncio
import logging

from kvlab.proxy.limits import ClientLimits, Notices
from kvlab.proxy.metrics import ProxyMetrics
from kvlab.proxy.server import ClientConnection, Handler

log = logging.getLogger("kvlab.proxy")


class Front:
    """Every client connection of one proxy: handler, limits, deadlines, the cap, counts."""

    def __init__(self, handler: Handler, limits: ClientLimits, metrics: ProxyMetrics,
                 cap: int) -> None:
        self.handler = handler
        self.limits = limits
        self.metrics = metrics
        self.cap = cap  # connection_cap(): PROXY_MAX_CONNECTIONS, or fewer if files run out
        self.connections: set[ClientConnection] = set()
        self.notices = Notices()
        self._sweeper: asyncio.TimerHandle | None = None

    def protocol(self) -> ClientConnection:
        return ClientConnection(self)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(self.limits.sweep_every_s(), self.sweep, loop)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close what has waited too long (one pass over the connections, every ~1 s)."""
        now = loop.time()
        stall = self.limits.stall_timeout_s
        for conn in list(self.connections):
            if conn.deadline is not None and conn.deadline <= now:
                conn.expire()
            elif conn.paused_at is not None and now - conn.paused_at >= stall:
                conn.stalled()
        self._sweeper = loop.call_later(self.limits.sweep_every_s(), self.sweep, loop)

    # what the connections report -----------------------------------------------------
    def rejected(self, kind: str) -> None:
        self.metrics.outcome("rejected", "client")

    def timed_out(self, phase: str) -> None:
        self.metrics.timeouts[phase].inc()
        if phase in ("head", "body"):
            self.notices.warn("timeout", f"closed a client connection that sent no complete "
                                         f"request {phase} within "
                              f"{self.limits.head_timeout_s:g} s (PROXY_HEAD_TIMEOUT_S)")

    def over_cap(self) -> None:
        self.metrics.refused_cap.inc()
        self.notices.warn("cap", f"refused a client connection with 503: this worker holds "
                                 f"its limit of {self.cap} (PROXY_MAX_CONNECTIONS, and the "
                                 "open-file limit)")

    def failed(self, exc: BaseException) -> None:
        log.error("proxy request failed (a bug): %r", exc, exc_info=exc)
        self.metrics.outcome("internal_error", "proxy")
