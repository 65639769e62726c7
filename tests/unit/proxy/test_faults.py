"""The proxy under fault injection, on real loopback sockets with small fake engines.

Each fault gives its documented status (a JSON error naming the leg before streaming starts,
an SSE error event and a clean end after), is counted in /metrics, and leaves no handler
task or connection behind.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from fakes.fault_upstream import Behaviour, FaultUpstream
from kvlab.core.errors import RefusedError, UnreachableError
from kvlab.engines.ports import free_port
from kvlab.observe import metrics
from kvlab.proxy import ProxyApp, ProxyConfig, running
from kvlab.proxy.legs import check_legs
from kvlab.proxy.limits import ClientLimits

BODY = {"model": "fake-model", "prompt": "hello", "max_tokens": 4}
STREAM = {**BODY, "stream": True}


def proxy_tasks() -> list[asyncio.Task[Any]]:
    out = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        if code is not None and "kvlab/proxy" in code.co_filename:
            out.append(task)
    return out


@asynccontextmanager
async def proxy(prefill: FaultUpstream | str, decode: FaultUpstream | str,
                **options: Any) -> AsyncIterator[ProxyApp]:
    urls = [u if isinstance(u, str) else u.url for u in (prefill, decode)]
    config = ProxyConfig(prefill=(urls[0],), decode=(urls[1],), port=0,
                         compat=options.pop("compat", None), **options)
    async with running(config) as app:
        yield app
    await asyncio.sleep(0)  # let cancelled handlers run their last step
    assert proxy_tasks() == [], "a proxy task outlived the proxy"
    assert not app.connections
    for pool in (app.prefill, app.decode):
        assert all(not leg.origin.busy and not leg.origin.idle for leg in pool.legs)
        assert all(leg.outstanding == 0 for leg in pool.legs)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[FaultUpstream, FaultUpstream]]:
    async with FaultUpstream() as p, FaultUpstream() as d:
        yield p, d


async def counters(app: ProxyApp) -> metrics.Snapshot:
    async with httpx.AsyncClient(trust_env=False) as client:
        snap = await metrics.scrape(client, app.url + "/metrics")
    assert snap is not None
    return snap


def count(snap: metrics.Snapshot, outcome: str, leg: str = "") -> float:
    return snap.total("kvlab_proxy_requests", {"outcome": outcome, "leg": leg}) or 0.0


def client(app: ProxyApp, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=app.url, trust_env=False, timeout=10, **kw)


async def test_prefill_down_is_503_naming_prefill(pair: tuple[FaultUpstream, ...]) -> None:
    _, decode = pair
    async with proxy(f"127.0.0.1:{free_port()}", decode) as app, client(app) as c:
        reply = await c.post("/v1/completions", json=BODY)
        snap = await counters(app)
    assert reply.status_code == 503
    err = reply.json()["error"]
    assert err["leg"] == "prefill" and "prefill leg" in err["message"]
    assert decode.generations() == []
    assert count(snap, "unavailable", "prefill") == 1


async def test_decode_down_is_503_naming_decode(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, _ = pair
    async with proxy(prefill, f"127.0.0.1:{free_port()}") as app, client(app) as c:
        reply = await c.post("/v1/chat/completions", json={
            "model": "fake-model", "messages": [{"role": "user", "content": "x"}]})
        snap = await counters(app)
    assert reply.status_code == 503 and reply.json()["error"]["leg"] == "decode"
    assert len(prefill.generations()) == 1
    assert count(snap, "unavailable", "decode") == 1


async def test_decode_dying_mid_stream_ends_with_an_sse_error(
        pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    decode.behaviour = Behaviour(mode="die", chunks=6, die_after=2)
    async with proxy(prefill, decode) as app, client(app) as c:
        async with c.stream("POST", "/v1/completions", json=STREAM) as reply:
            assert reply.status_code == 200
            assert reply.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in reply.aiter_lines() if line]
        snap = await counters(app)
    assert lines[:2] == ['data: {"choices":[{"index":0,"text":"t0"}]}',
                         'data: {"choices":[{"index":0,"text":"t1"}]}']
    assert lines[2] == "event: error"
    error = json.loads(lines[3].removeprefix("data: "))["error"]
    assert error["leg"] == "decode" and "mid-stream" in error["message"]
    assert "data: [DONE]" not in lines
    assert count(snap, "stream_error", "decode") == 1 and count(snap, "ok") == 0


async def test_slow_prefill_past_its_timeout_is_504_and_closed(
        pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    prefill.behaviour = Behaviour(mode="stall")
    async with proxy(prefill, decode, prefill_timeout_s=0.3) as app, client(app) as c:
        started = time.monotonic()
        reply = await c.post("/v1/completions", json=BODY)
        took = time.monotonic() - started
        snap = await counters(app)
    assert reply.status_code == 504 and reply.json()["error"]["leg"] == "prefill"
    assert 0.3 <= took < 3
    await _eventually(lambda: prefill.generations()[0].closed_ns is not None)
    assert decode.generations() == []
    assert count(snap, "timeout", "prefill") == 1


async def test_silent_decode_past_its_read_timeout(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    decode.behaviour = Behaviour(mode="stall_stream", chunks=5)
    async with proxy(prefill, decode, decode_timeout_s=0.3) as app, client(app) as c:
        async with c.stream("POST", "/v1/completions", json=STREAM) as reply:
            lines = [line async for line in reply.aiter_lines() if line]
        snap = await counters(app)
    assert reply.status_code == 200 and lines[1] == "event: error"
    assert "no data for 0.3 s" in lines[2]
    await _eventually(lambda: decode.generations()[0].closed_ns is not None)
    assert count(snap, "stream_error", "decode") == 1


async def _disconnect_after(app: ProxyApp, body: dict[str, Any], events: int) -> int:
    """Send `body` on a raw socket, read `events` SSE events, close; the close time (ns)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
    raw = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                 b"\r\ncontent-length: %d\r\n\r\n%s" % (len(raw), raw))
    seen = b""
    while seen.count(b"data: ") < events:
        seen += await reader.read(4096)
    closed = time.perf_counter_ns()
    writer.close()
    await writer.wait_closed()
    return closed


async def test_client_disconnect_closes_decode_within_100_ms(
        pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    decode.behaviour = Behaviour(chunks=10_000, itl_s=0.01)
    async with proxy(prefill, decode) as app:
        closed = await _disconnect_after(app, STREAM, 3)
        await _eventually(lambda: decode.generations()[0].closed_ns is not None)
        snap = await counters(app)
    seen = decode.generations()[0]
    assert seen.closed_ns is not None and not seen.finished
    assert (seen.closed_ns - closed) / 1e6 < 100
    assert snap.total("kvlab_proxy_aborts", {"stage": "decode"}) == 1
    assert count(snap, "aborted", "client") == 1


async def test_client_disconnect_during_prefill_closes_prefill(
        pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    prefill.behaviour = Behaviour(mode="stall")
    async with proxy(prefill, decode) as app:
        _, writer = await asyncio.open_connection("127.0.0.1", app.port)
        raw = json.dumps(STREAM).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(raw), raw))
        await _eventually(lambda: len(prefill.generations()) == 1)
        closed = time.perf_counter_ns()
        writer.close()
        await writer.wait_closed()
        await _eventually(lambda: prefill.generations()[0].closed_ns is not None)
        snap = await counters(app)
    assert ((prefill.generations()[0].closed_ns or 0) - closed) / 1e6 < 100
    assert decode.generations() == []
    assert snap.total("kvlab_proxy_aborts", {"stage": "prefill"}) == 1


async def test_bad_requests_are_400_and_reach_no_engine(
        pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    async with proxy(prefill, decode) as app, client(app) as c:
        broken = await c.post("/v1/completions", content=b'{"model": "m", "prompt": ')
        no_model = await c.post("/v1/completions", json={"prompt": "x"})
        not_object = await c.post("/v1/chat/completions", json=["model"])
        bad_stream = await c.post("/v1/completions", json={**BODY, "stream": "yes"})
        snap = await counters(app)
    assert [r.status_code for r in (broken, no_model, not_object, bad_stream)] == [400] * 4
    assert "not valid JSON" in broken.json()["error"]["message"]
    assert no_model.json()["error"]["param"] == "model"
    assert prefill.seen == [] and decode.seen == []
    assert count(snap, "rejected", "client") == 4


async def test_oversize_bodies_are_413(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    big = {**BODY, "prompt": "x" * 5000}

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 600

    async with proxy(prefill, decode, limits=ClientLimits(max_body_bytes=2000)) as app:
        async with client(app) as c:
            declared = await c.post("/v1/completions", json=big)
        async with client(app) as c:
            streamed = await c.post("/v1/completions", content=chunked())
        async with client(app) as c:
            fine = await c.post("/v1/completions", json=BODY)
            snap = await counters(app)
    assert declared.status_code == streamed.status_code == 413
    assert "PROXY_MAX_BODY_BYTES" in declared.json()["error"]["message"]
    assert fine.status_code == 200
    assert count(snap, "rejected", "client") == 2
    assert len(prefill.generations()) == 1


async def test_bearer_key(pair: tuple[FaultUpstream, ...], caplog: pytest.LogCaptureFixture
                          ) -> None:
    prefill, decode = pair
    key = "k-7f3a9-secret"
    async with proxy(prefill, decode, api_key=key) as app, client(app) as c:
        missing = await c.post("/v1/completions", json=BODY)
        wrong = await c.post("/v1/completions", json=BODY,
                             headers={"Authorization": "Bearer k-7f3a9-secreT"})
        right = await c.post("/v1/completions", json=BODY,
                             headers={"Authorization": f"Bearer {key}"})
        models = await c.get("/v1/models")
        health = await c.get("/health")
        snap = await counters(app)
    assert missing.status_code == wrong.status_code == models.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200 and health.status_code == 200
    assert count(snap, "rejected", "client") == 3
    assert key not in caplog.text and key not in repr(app.config)
    assert "authorization" not in decode.generations()[0].headers


async def test_decode_500_is_502_not_200(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    decode.behaviour = Behaviour(mode="status", status=500)
    async with proxy(prefill, decode) as app, client(app) as c:
        reply = await c.post("/v1/completions", json=STREAM)
        snap = await counters(app)
    assert reply.status_code == 502
    err = reply.json()["error"]
    assert err["leg"] == "decode" and err["upstream_status"] == 500
    assert "fake engine failure" in err["message"]
    assert count(snap, "upstream_error", "decode") == 1


async def test_prefill_4xx_is_passed_on(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    prefill.behaviour = Behaviour(mode="status", status=400)
    async with proxy(prefill, decode) as app, client(app) as c:
        reply = await c.post("/v1/completions", json=BODY)
    assert reply.status_code == 400 and reply.json()["error"]["leg"] == "prefill"
    assert decode.generations() == []


async def test_nixl_round_trip_with_one_request_id(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    async with proxy(prefill, decode, connector="nixl") as app, client(app) as c:
        reply = await c.post("/v1/completions", json=STREAM,
                             headers={"X-Request-Id": "client-rid-1"})
        generated = await c.post("/v1/completions", json=BODY)
    p1, p2 = prefill.generations()
    d1, d2 = decode.generations()
    assert reply.headers["x-request-id"] == "client-rid-1"
    assert p1.headers["x-request-id"] == d1.headers["x-request-id"] == "client-rid-1"
    assert p2.headers["x-request-id"] == d2.headers["x-request-id"] == \
        generated.headers["x-request-id"] != "client-rid-1"
    assert p1.body["kv_transfer_params"]["do_remote_decode"] is True
    assert p1.body["max_tokens"] == 1 and p1.body["stream"] is False
    assert d1.body["kv_transfer_params"]["remote_block_ids"] == [[1, 2]]
    assert d1.body["kv_transfer_params"]["remote_request_id"] == "client-rid-1"
    assert d1.body["stream"] is True and d1.body["max_tokens"] == 4
    assert "x-kvlab-kv-transfer" not in reply.headers


async def test_prefill_without_params_is_counted_and_marked(
        pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    prefill.behaviour = Behaviour(mode="no_params")
    async with proxy(prefill, decode, connector="nixl") as app, client(app) as c:
        reply = await c.post("/v1/completions", json=BODY)
        snap = await counters(app)
    assert reply.status_code == 200
    assert reply.headers["x-kvlab-kv-transfer"] == "missing"
    assert snap.total("kvlab_proxy_prefill_without_kv_params") == 1
    assert "kv_transfer_params" not in decode.generations()[0].body


async def test_prefill_garbage_under_nixl_is_502(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    prefill.behaviour = Behaviour(mode="garbage")
    async with proxy(prefill, decode, connector="nixl") as app, client(app) as c:
        reply = await c.post("/v1/completions", json=BODY)
    assert reply.status_code == 502 and reply.json()["error"]["leg"] == "prefill"
    assert decode.generations() == []


async def test_routes_health_and_models(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    async with proxy(prefill, decode) as app, client(app) as c:
        assert (await c.get("/health")).json()["status"] == "ok"
        assert (await c.get("/v1/models")).json()["data"][0]["id"] == "fake-model"
        assert (await c.get("/v1/embeddings")).status_code == 404
        assert (await c.get("/v1/completions")).status_code == 405
        whole = await c.post("/v1/completions", json=BODY)
        assert whole.status_code == 200 and whole.json()["choices"][0]["text"] == "t"
    async with proxy(prefill, f"127.0.0.1:{free_port()}") as app, client(app) as c:
        health = await c.get("/health")
    assert health.status_code == 503
    legs = health.json()["legs"]
    assert legs[f"prefill {prefill.url}"] == "ok"
    assert next(v for k, v in legs.items() if k.startswith("decode")).startswith("failed")


async def test_round_robin_over_two_decodes(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    async with FaultUpstream() as decode2:
        config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url, decode2.url),
                             port=0, compat=None)
        async with running(config) as app, client(app) as c:
            for _ in range(4):
                assert (await c.post("/v1/completions", json=BODY)).status_code == 200
    assert len(decode.generations()) == len(decode2.generations()) == 2


async def test_engines_that_disagree_are_refused(pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    decode.behaviour = Behaviour(max_model_len=8192)
    with pytest.raises(RefusedError, match="max_model_len"):
        await check_legs([prefill.url], [decode.url])
    decode.behaviour = Behaviour(model="other-model")
    with pytest.raises(RefusedError, match="model_id"):
        async with running(ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0)):
            pass
    decode.behaviour = Behaviour()
    facts = await check_legs([prefill.url], [decode.url])
    assert [f.role for f in facts] == ["prefill", "decode"]
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(UnreachableError, match="prefill instance is not answering"):
        await check_legs([dead], [decode.url])


async def test_start_up_runs_the_whole_compatibility_check(
        pair: tuple[FaultUpstream, ...]) -> None:
    prefill, decode = pair
    decode.behaviour = Behaviour(version="0.0.1-other")
    with pytest.raises(RefusedError, match="instances disagree on version"):
        async with running(ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0)):
            pass
    facts = await check_legs([prefill.url], [decode.url], ignore=("version",))
    assert [f.role for f in facts] == ["prefill", "decode"]


async def test_a_leg_that_dies_during_the_start_up_check_stops_the_start(
        pair: tuple[FaultUpstream, ...]) -> None:
    # #48 finding 2: the proxy said "OK: the decode instance answers" and "ready" in front
    # of an engine its own check had killed
    prefill, decode = pair
    prefill.behaviour = Behaviour(vllm_metrics=True, dies_on="/v1/completions")
    decode.behaviour = Behaviour(vllm_metrics=True)
    with pytest.raises(UnreachableError) as err:
        async with running(ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0)):
            pass
    assert str(err.value) == (
        f"the prefill instance on {prefill.url} stopped answering during the proxy's start-up "
        "check (it answered at its start): see its log for the cause; the proxy did not start "
        "in front of it")
    assert prefill.generations()[-1].path == "/v1/completions"  # the identity probe killed it


async def _eventually(check: Any, within_s: float = 3.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_check_blames_a_prefill_that_answered_500(pair: tuple[FaultUpstream, ...]) -> None:
    """Prefill answers 500 and decode never gets the request: `proxy --check` names the
    prefill leg, and reads nothing about recomputing from decode's idle counters."""
    from kvlab.proxy.check import crossing_check

    prefill, decode = pair
    prefill.behaviour = Behaviour(mode="status", status=500, vllm_metrics=True)
    decode.behaviour = Behaviour(vllm_metrics=True)
    async with proxy(prefill, decode) as app:
        crossing = await crossing_check(app.url, [prefill.url], [decode.url], "fake-model",
                                        timeout_s=10)
    assert crossing.status == 502 and not crossing.crossed
    assert decode.generations() == []
    said = " ".join(crossing.reasons)
    assert "the prefill leg failed the request (the proxy's error names it)" in said
    assert "decode never got it" in said
    assert "recomputed" not in said and "did not call prefill" not in said


async def test_check_blames_decode_when_prefill_finished(pair: tuple[FaultUpstream, ...]
                                                        ) -> None:
    from kvlab.proxy.check import crossing_check

    prefill, decode = pair
    prefill.behaviour = Behaviour(vllm_metrics=True)
    decode.behaviour = Behaviour(mode="status", status=500, vllm_metrics=True)
    async with proxy(prefill, decode) as app:
        crossing = await crossing_check(app.url, [prefill.url], [decode.url], "fake-model",
                                        timeout_s=10)
    said = " ".join(crossing.reasons)
    assert "the decode leg failed the request (the proxy's error names it)" in said
    assert "prefill had finished it" in said and "recomputed" not in said
