"""Where the proxy listens, and what it tells those who did not show the key (issue 14, 9).

`--host 0.0.0.0` with no client key is allowed (a lab may want it) but says so in one
warning line at every start, and the banner shows the address as bound. With a key set,
/health and /metrics stay open for monitoring but name no engine URL; /health shows the
URLs to a client that presents the key.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from adversarial.wire import Upstreams, proxy_process
from kvlab.proxy import ProxyConfig, running

KEY = "k-adversarial-7f3a9"
EVERYWHERE = "0.0.0.0"  # noqa: S104 - binding every interface is what is under test


def test_listening_beyond_loopback_without_a_key_warns(engines: Upstreams,
                                                       tmp_path: Path) -> None:
    with proxy_process(engines, tmp_path, "--host", EVERYWHERE) as proxy:
        text = proxy.log_text()
    assert f"listening  http://{EVERYWHERE}:{proxy.port}" in text
    assert f"==> ready: http://{EVERYWHERE}:{proxy.port}" in text
    warnings = [ln for ln in text.splitlines() if ln.startswith("kvlab: warning:")]
    assert len(warnings) == 1 and EVERYWHERE in warnings[0]
    assert "PROXY_API_KEY_ENV" in warnings[0]
    with proxy_process(engines, tmp_path) as local:
        assert "warning" not in local.log_text()
    keyed = {"PROXY_API_KEY_ENV": "ADVERSARIAL_KEY", "ADVERSARIAL_KEY": KEY}
    with proxy_process(engines, tmp_path, "--host", EVERYWHERE, env=keyed) as guarded:
        assert "warning" not in guarded.log_text()


async def test_with_a_key_open_routes_name_no_engine(engines: Upstreams) -> None:
    urls = (f"127.0.0.1:{engines.prefill}", f"127.0.0.1:{engines.decode}")
    config = ProxyConfig(prefill=(urls[0],), decode=(urls[1],), port=0, compat=None,
                         api_key=KEY)
    async with running(config) as app, httpx.AsyncClient(base_url=app.url,
                                                         trust_env=False) as client:
        health = await client.get("/health")
        scraped = await client.get("/metrics")
        shown = await client.get("/health", headers={"Authorization": f"Bearer {KEY}"})
    assert health.status_code == scraped.status_code == 200
    assert health.json()["legs"] == {"prefill #0": "ok", "decode #0": "ok"}
    for port in (engines.prefill, engines.decode):
        assert str(port) not in health.text and str(port) not in scraped.text
    assert set(shown.json()["legs"]) == {f"prefill http://{urls[0]}", f"decode http://{urls[1]}"}
    assert KEY not in scraped.text
