"""kvlab's own prefill/decode proxy (`kvlab proxy`): protocol, server, legs, metrics.

`running(ProxyConfig.from_settings(settings))` gives a started proxy that is always closed;
`serve(config, on_ready)` runs one in the foreground until cancelled (Ctrl-C).
"""

from kvlab.proxy.app import ProxyApp, running, serve
from kvlab.proxy.config import ProxyConfig

__all__ = ["ProxyApp", "ProxyConfig", "running", "serve"]
