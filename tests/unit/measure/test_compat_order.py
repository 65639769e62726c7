"""The instance check probes one instance at a time: a split's consumer must never read the
fingerprint prompt's store entry while its producer is still writing it (CI, 2026-11-30:
vLLM's shared-storage consumer died on a missing layer file during `kvlab run all`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvlab.measure import compat


def test_instances_are_probed_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    in_flight, most, order = 0, 0, []

    async def slow_probe(client: Any, url: str, *, with_fingerprint: bool = False) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)  # a producer writing its layers
        order.append(url)
        in_flight -= 1
        return compat.InstanceFacts(url=url)

    monkeypatch.setattr(compat, "probe", slow_probe)
    urls = ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "http://127.0.0.1:3/v1"]
    result = asyncio.run(compat.compare(urls, ignore=(compat.FINGERPRINT,)))
    assert most == 1
    assert order == urls  # the producer (named first) before the consumer
    assert [f.url for f in result.instances] == urls
