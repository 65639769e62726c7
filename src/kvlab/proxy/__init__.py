"""kvlab's own prefill/decode proxy (`kvlab proxy`): protocol, server, legs, metrics.

`running(ProxyConfig.from_settings(settings))` gives a started proxy that is always closed;
`serve(config, on_ready)` runs one in the foreground until cancelled (Ctrl-C).

This module is the package's surface: other packages import the proxy's names (and the
`affinity` module: its routing rules, which `plan` replays) from here.
"""

from kvlab.proxy import affinity
from kvlab.proxy.affinity import body_digest
from kvlab.proxy.app import ProxyApp, loop_runner, running, serve
from kvlab.proxy.args import ProxyArgs, process_plan
from kvlab.proxy.check import Crossing, check_proxy, crossing_check
from kvlab.proxy.config import ProxyConfig, listen_url
from kvlab.proxy.legs import BALANCES, Balance, LegFacts
from kvlab.proxy.workers import serve_workers, spread_note

__all__ = [
    "BALANCES",
    "Balance",
    "Crossing",
    "LegFacts",
    "ProxyApp",
    "ProxyArgs",
    "ProxyConfig",
    "affinity",
    "body_digest",
    "check_proxy",
    "crossing_check",
    "listen_url",
    "loop_runner",
    "process_plan",
    "running",
    "serve",
    "serve_workers",
    "spread_note",
]
