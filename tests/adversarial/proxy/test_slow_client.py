"""A client that reads slower than decode writes is not a decode failure (issue 14, item 5).

Decode streams about 13 MB as fast as it can; the client's receive buffer is small, so the
proxy's writes back up and it stops reading decode (backpressure). Decode's silence timer
(here 0.5 s) must not fire while the wait is the client's: a client that pauses 2 s and then
reads gets the whole stream, counted ok. A client that never reads is cut off after
PROXY_CLIENT_STALL_TIMEOUT_S and counted as a slow client, with decode closed; neither is
counted as a decode error.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from adversarial.wire import generation
from fakes.fault_upstream import Behaviour, FaultUpstream
from kvlab.core.settings import Settings
from kvlab.observe import metrics
from kvlab.proxy import ProxyApp, ProxyConfig, running

FLOOD = Behaviour(chunks=400, pad=32 * 1024, itl_s=0)


@pytest.fixture
async def flooding() -> AsyncIterator[tuple[FaultUpstream, FaultUpstream]]:
    async with FaultUpstream() as p, FaultUpstream(FLOOD) as d:
        yield p, d


async def _slow_socket(app: ProxyApp) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", app.port))
    await loop.sock_sendall(sock, generation())
    return sock


async def _snapshot(app: ProxyApp) -> metrics.Snapshot:
    async with httpx.AsyncClient(trust_env=False) as client:
        snap = await metrics.scrape(client, app.url + "/metrics")
    assert snap is not None
    return snap


def _count(snap: metrics.Snapshot, outcome: str, leg: str) -> float:
    return snap.total("kvlab_proxy_requests", {"outcome": outcome, "leg": leg}) or 0.0


def _config(prefill: FaultUpstream, decode: FaultUpstream, **settings: Any) -> ProxyConfig:
    config = ProxyConfig.from_settings(Settings(**settings), (prefill.url,), (decode.url,),
                                       port=0, decode_timeout_s=0.5)
    return replace(config, compat=None)


async def test_a_slow_reader_gets_the_whole_stream(
        flooding: tuple[FaultUpstream, FaultUpstream]) -> None:
    prefill, decode = flooding
    loop = asyncio.get_running_loop()
    async with running(_config(prefill, decode)) as app:
        sock = await _slow_socket(app)
        try:
            await asyncio.sleep(2.0)  # four times decode's silence limit, reading nothing
            got = bytearray()
            while not got.endswith(b"0\r\n\r\n"):
                piece = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 10)
                assert piece, "the proxy closed the stream"
                got += piece
        finally:
            sock.close()
        snap = await _snapshot(app)
    assert b"event: error" not in got
    assert got.count(b'"text":"t') == FLOOD.chunks and b"data: [DONE]" in got
    assert _count(snap, "ok", "") == 1
    assert _count(snap, "stream_error", "decode") == 0


async def test_a_client_that_never_reads_is_cut_off_as_slow(
        flooding: tuple[FaultUpstream, FaultUpstream]) -> None:
    prefill, decode = flooding
    async with running(_config(prefill, decode, proxy_client_stall_timeout_s=1.0)) as app:
        sock = await _slow_socket(app)
        try:
            started = time.monotonic()
            while decode.generations()[-1:] == [] or decode.generations()[0].closed_ns is None:
                assert time.monotonic() - started < 10, "decode was never closed"
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
        finally:
            sock.close()
        snap = await _snapshot(app)
    assert 1.0 <= took < 5
    assert not decode.generations()[0].finished
    assert _count(snap, "slow_client", "client") == 1
    assert _count(snap, "stream_error", "decode") == 0
    assert snap.total("kvlab_proxy_client_timeouts", {"phase": "write"}) == 1
