"""One request, one timeline, on real loopback sockets with small fake engines: the client's
X-Request-Id (however its name is spelt) reaches both legs; asked by X-Kvlab-Timeline, the
proxy appends its timeline of the request to the stream as an SSE comment, whose parts carry
the legs' own delays; the load generator joins it to the request's line by id."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from fakes import fault_upstream
from fakes.fault_upstream import FaultUpstream
from kvlab.loadgen.client import Endpoint, request_id_of
from kvlab.loadgen.sweep import LoadSpec, run_level
from kvlab.observe import sse
from kvlab.proxy import ProxyConfig, running
from kvlab.records import requests

STREAM = {"model": "fake-model", "prompt": "hello", "max_tokens": 4, "stream": True}
PREFILL_DELAY_S, DECODE_DELAY_S = 0.05, 0.03


def upstreams() -> tuple[FaultUpstream, FaultUpstream]:
    return (FaultUpstream(fault_upstream.Behaviour(delay_s=PREFILL_DELAY_S)),
            FaultUpstream(fault_upstream.Behaviour(delay_s=DECODE_DELAY_S)))


@pytest.mark.parametrize("name", ["X-Request-Id", "x-request-id", "X-REQUEST-ID"])
async def test_the_clients_id_reaches_both_legs_however_spelt(name: str) -> None:
    async with FaultUpstream() as prefill, FaultUpstream() as decode:
        config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0,
                             connector="nixl")
        async with running(config) as app, httpx.AsyncClient(trust_env=False) as c:
            reply = await c.post(app.url + "/v1/completions", json=STREAM,
                                 headers={name: "kvlab-abc123"})
    p, d = prefill.generations()[-1], decode.generations()[-1]
    assert reply.headers["x-request-id"] == "kvlab-abc123"
    assert p.headers["x-request-id"] == d.headers["x-request-id"] == "kvlab-abc123"


async def stream_through(app_url: str, headers: dict[str, str]) -> tuple[bytes, float]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        started = time.perf_counter()
        async with c.stream("POST", app_url + "/v1/completions", json=STREAM,
                            headers=headers) as response:
            body = b"".join([piece async for piece in response.aiter_raw()])
    return body, time.perf_counter() - started


async def test_the_timeline_comes_after_the_answer_when_asked() -> None:
    prefill, decode = upstreams()
    async with prefill, decode:
        config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0,
                             connector="nixl")
        async with running(config) as app:
            asked, took = await stream_through(app.url, {"x-request-id": "r-1",
                                                         "X-Kvlab-Timeline": "1"})
            plain, _ = await stream_through(app.url, {"x-request-id": "r-2"})
    events = asked.split(b"\n\n")
    assert events[-2] == b"data: [DONE]" or sse.TIMELINE_PREFIX in events[-2]
    timeline = sse.timeline_of(events[-2])
    assert timeline is not None and asked.rstrip().endswith(b"}")
    assert asked.index(b"data: [DONE]") < asked.index(sse.TIMELINE_PREFIX)
    assert timeline["id"] == "r-1"
    parts = [timeline[f"{k}_ns"] for k in ("prefill", "handover", "decode", "proxy")]
    assert all(isinstance(v, int) and v >= 0 for v in parts)
    # each leg's own delay is inside its part (a lower bound: no wall-clock speed assumed)
    assert timeline["prefill_ns"] >= PREFILL_DELAY_S * 1e9
    assert timeline["decode_ns"] >= DECODE_DELAY_S * 1e9
    assert sum(parts) <= took * 1e9  # inside the client's own window
    assert sse.TIMELINE_PREFIX not in plain and plain.endswith(b"data: [DONE]\n\n")


async def test_a_whole_json_answer_carries_no_timeline() -> None:
    async with FaultUpstream() as prefill, FaultUpstream() as decode:
        config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0)
        async with running(config) as app, httpx.AsyncClient(trust_env=False) as c:
            reply = await c.post(app.url + "/v1/completions",
                                 json={**STREAM, "stream": False},
                                 headers={"X-Kvlab-Timeline": "1"})
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == "t"


def test_request_bytes_carry_a_new_id_each_and_ask_for_the_timeline() -> None:
    target = Endpoint.from_url("http://127.0.0.1:9/v1")
    one = target.request_bytes("/completions", {"model": "m"})
    two = target.request_bytes("/completions", {"model": "m"})
    head = one.split(b"\r\n\r\n", 1)[0]
    assert b"\r\nX-Request-Id: kvlab-" in head and b"\r\nX-Kvlab-Timeline: 1\r\n" in head
    assert request_id_of(one).startswith("kvlab-") and request_id_of(one) != request_id_of(two)
    assert request_id_of(target.request_bytes("/c", {}, request_id="mine")) == "mine"
    assert request_id_of(b"POST / HTTP/1.1\r\n\r\n") == ""


async def test_the_per_request_file_joins_the_proxys_timeline(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    prefill, decode = upstreams()
    async with prefill, decode:
        config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0,
                             connector="nixl")
        async with running(config) as app:
            spec = LoadSpec(base_url=app.url + "/v1", model="fake-model", levels=(2,),
                            requests=4, max_tokens=4, prompt_set="shared-prefix",
                            label="split", preamble_tokens=40, scrape_metrics=False,
                            labbook=str(book), endpoint="completions", warmup=1)
            row = await run_level(spec, Endpoint.from_url(spec.base_url), 2, 0)
    assert row.requests_file is not None
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    sent = {s.headers["x-request-id"] for s in decode.generations()[-5:]}
    assert {x.request_id for x in lines} == sent and len(sent) == len(lines) == 5
    for x in lines:
        assert x.status == "ok" and x.timeline is not None and x.ttft_s is not None
        t = x.timeline
        total = t.prefill_s + t.handover_s + t.decode_s + t.proxy_s + t.to_token_s + t.wire_s
        assert abs(total - x.ttft_s) <= 5e-6  # rounding of six parts to the microsecond
        assert t.wire_s >= -5e-6  # the proxy's window lies inside the client's
        assert t.to_token_s >= 0  # completions: the first event is the first token
        assert t.prefill_s >= PREFILL_DELAY_S and t.decode_s >= DECODE_DELAY_S
    parts = row.ttft_parts
    assert parts is not None and parts.requests == 4 and parts.without == 0
    assert abs(parts.prefill + parts.handover + parts.decode + parts.proxy + parts.wire
               - parts.ttft_mean) <= 5e-6


def test_a_timeline_naming_another_request_or_odd_figures_is_not_joined() -> None:
    from kvlab.loadgen import stats
    from kvlab.loadgen.record import RequestRecord

    def record(timeline: dict[str, object]) -> RequestRecord:
        return RequestRecord(index=0, prompt_index=0, sent_ns=0, status=200,
                             request_id="kvlab-1", token_ns=[900_000], first_event_ns=800_000,
                             timeline=timeline)

    good = {"id": "kvlab-1", "prefill_ns": 300_000, "handover_ns": 10_000,
            "decode_ns": 200_000, "proxy_ns": 40_000}
    t = stats.timeline(record(good))
    assert t is not None and (t.to_token_s, t.wire_s) == (1e-4, 2.5e-4)
    for bad in ({**good, "id": "kvlab-2"}, {**good, "decode_ns": -1},
                {**good, "proxy_ns": "40"}, {k: v for k, v in good.items() if k != "id"}):
        assert stats.timeline(record(bad)) is None, bad
