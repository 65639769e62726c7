"""Request bodies the proxy must not choke on, and ones the engine refuses (issue 14, 6/10).

Deeply nested JSON is the client's error (400, counted), not a RecursionError traceback and
a 500. A body without a prompt, or with max_tokens of -5 or 1e12, passes through untouched
(the engine owns the API), and the engine's 400 reaches the client as that 400, counted
apart from engine failures (`upstream_rejected`, not `upstream_error`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adversarial.wire import ProxyProcess, ask, generation, no_traceback
from fakes.fault_upstream import Behaviour, FaultUpstream
from kvlab.observe import metrics
from kvlab.proxy import ProxyConfig, running


def test_deeply_nested_json_is_a_counted_400(front: ProxyProcess) -> None:
    rejected = front.count("kvlab_proxy_requests", outcome="rejected", leg="client")
    depth = 100_000
    bodies = [b"[" * depth + b"]" * depth,
              b'{"model":"fake-model","prompt":' + b"[" * depth + b"]" * depth + b"}"]
    for body in bodies:
        reply = ask(front.port, generation(body=body))
        assert reply.status == 400, reply
        assert b"nested too deeply" in reply.body
    assert front.count("kvlab_proxy_requests", outcome="rejected", leg="client") == \
        rejected + 2
    assert front.count("kvlab_proxy_requests", outcome="internal_error", leg="proxy") == 0
    no_traceback(front)


@pytest.fixture
async def validating() -> AsyncIterator[tuple[FaultUpstream, FaultUpstream]]:
    async with FaultUpstream(Behaviour(mode="validate")) as p, \
            FaultUpstream(Behaviour(mode="validate")) as d:
        yield p, d


def _count(snap: metrics.Snapshot, outcome: str, leg: str) -> float:
    return snap.total("kvlab_proxy_requests", {"outcome": outcome, "leg": leg}) or 0.0


async def test_the_engines_4xx_reaches_the_client_counted(
        validating: tuple[FaultUpstream, FaultUpstream]) -> None:
    prefill, decode = validating
    config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0, compat=None)
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"model": "fake-model"}, "prefill", "prompt or messages"),
        ({"model": "fake-model", "prompt": "x", "max_tokens": -5}, "decode", "got -5"),
        ({"model": "fake-model", "prompt": "x", "max_tokens": 1e12, "stream": True},
         "decode", "got 1000000000000.0"),
    ]
    async with running(config) as app, httpx.AsyncClient(base_url=app.url,
                                                         trust_env=False) as client:
        for body, leg, says in cases:
            reply = await client.post("/v1/completions", json=body)
            assert reply.status_code == 400, reply.text
            err = reply.json()["error"]
            assert err["leg"] == leg and err["upstream_status"] == 400
            assert says in err["message"]
        snap = await metrics.scrape(client, app.url + "/metrics")
    assert snap is not None
    assert _count(snap, "upstream_rejected", "prefill") == 1
    assert _count(snap, "upstream_rejected", "decode") == 2
    assert _count(snap, "upstream_error", "prefill") == _count(snap, "upstream_error",
                                                               "decode") == 0
    assert decode.generations()[0].body["max_tokens"] == -5  # passed through untouched
