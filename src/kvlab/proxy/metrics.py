"""The proxy's own Prometheus metrics, in a registry per proxy (no module-level state).

- `kvlab_proxy_requests_total{outcome,leg}`: every generation request once, by how it ended:
  ok, rejected (refused before any leg: 400/401/404/405/408/413/414/431, on any route),
  upstream_rejected (an engine answered 4xx, passed on as that 4xx: the request's fault),
  upstream_error (a leg answered 5xx or broken HTTP: 502), unavailable (503), timeout (504),
  stream_error (decode failed after streaming began), aborted (the client went away),
  slow_client (the client left the response unread past PROXY_CLIENT_STALL_TIMEOUT_S),
  internal_error (a bug in the proxy: 500, with its traceback in the log).
- `kvlab_proxy_client_timeouts_total{phase}`: client connections closed by a timeout: head
  (408, or nothing sent at all), body (408), idle (keep-alive), write (a slow reader).
- `kvlab_proxy_connections_refused_total{reason}`: connections answered 503 at once (cap:
  the worker holds PROXY_MAX_CONNECTIONS already); `kvlab_proxy_client_connections`: open.
- `kvlab_proxy_prefill_without_kv_params_total`: NIXL/Mooncake hand-overs where prefill
  gave decode nothing to pull, so decode recomputed the prompt (also a response header).
- `kvlab_proxy_aborts_total{stage}`: client disconnects that closed a leg (prefill/decode).
- `kvlab_proxy_leg_seconds{leg}`: prefill's whole answer; decode's first body byte.
- `kvlab_proxy_added_seconds`: the proxy's own time before the client's first byte (arrival
  to first chunk out, minus both legs' waits).
- `kvlab_proxy_outstanding{leg,url}`: requests in flight per engine.
Counters are bound to their label values once, so a request pays a few increments.

With several worker processes (`workers.py`) each worker records into prometheus_client's
multiprocess files (PROMETHEUS_MULTIPROC_DIR, set before the worker starts) and whichever
worker answers /metrics renders the sum over all of them.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# (outcome, leg) pairs that can happen; each is exported from the start, at 0
OUTCOMES = (("ok", ""), ("rejected", "client"), ("aborted", "client"),
            ("slow_client", "client"), ("stream_error", "decode"), ("internal_error", "proxy"),
            *((o, leg) for o in ("upstream_rejected", "upstream_error", "unavailable",
                                 "timeout")
              for leg in ("prefill", "decode")))
TIMEOUT_PHASES = ("head", "body", "idle", "write")
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ProxyMetrics:
    """Counters and histograms of one proxy; `exposition()` renders them."""

    def __init__(self, shared: bool = False) -> None:
        """`shared`: one of several workers; the multiprocess directory must be set."""
        self.shared_dir = os.environ[MULTIPROC_ENV] if shared else None
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        requests = Counter("kvlab_proxy_requests", "Generation requests by outcome.",
                           ["outcome", "leg"], registry=reg)
        self.requests = {(o, leg): requests.labels(o, leg) for o, leg in OUTCOMES}
        self.no_params = Counter(
            "kvlab_proxy_prefill_without_kv_params",
            "Hand-overs where prefill returned no kv_transfer_params (decode recomputed).",
            registry=reg)
        aborts = Counter("kvlab_proxy_aborts", "Client disconnects that closed a leg.",
                         ["stage"], registry=reg)
        self.aborts = {s: aborts.labels(s) for s in ("prefill", "decode")}
        legs = Histogram("kvlab_proxy_leg_seconds",
                         "Prefill: whole answer; decode: first body byte.", ["leg"],
                         buckets=_BUCKETS, registry=reg)
        self.prefill_s = legs.labels("prefill")
        self.decode_s = legs.labels("decode")
        self.added_s = Histogram("kvlab_proxy_added_seconds",
                                 "The proxy's own time before the client's first byte.",
                                 buckets=_BUCKETS, registry=reg)
        self.outstanding = Gauge("kvlab_proxy_outstanding", "Requests in flight per engine.",
                                 ["leg", "url"], multiprocess_mode="livesum", registry=reg)
        timeouts = Counter("kvlab_proxy_client_timeouts",
                           "Client connections closed by a timeout, by phase.", ["phase"],
                           registry=reg)
        self.timeouts = {p: timeouts.labels(p) for p in TIMEOUT_PHASES}
        refused = Counter("kvlab_proxy_connections_refused",
                          "Client connections answered 503 at once, by reason.", ["reason"],
                          registry=reg)
        self.refused_cap = refused.labels("cap")
        self.clients = Gauge("kvlab_proxy_client_connections", "Open client connections.",
                             multiprocess_mode="livesum", registry=reg)

    def outcome(self, outcome: str, leg: str = "") -> None:
        self.requests[(outcome, leg)].inc()

    def exposition(self) -> bytes:
        if self.shared_dir is None:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, path=self.shared_dir)  # type: ignore[no-untyped-call]
        return generate_latest(every_worker)
