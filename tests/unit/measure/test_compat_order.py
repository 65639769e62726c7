"""The instance check probes one instance at a time: a split's consumer must never read the
fingerprint prompt's store entry while its producer is still writing it (CI, 2026-11-30:
vLLM's shared-storage consumer died on a missing layer file during `kvlab run all`)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from kvlab.measure import compat


def test_instances_are_probed_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    in_flight, most, order = 0, 0, []

    async def slow_probe(client: Any, url: str) -> Any:
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


def _facts_stub(monkeypatch: pytest.MonkeyPatch, **by_url: dict[str, Any]) -> list[str]:
    """Probe answers the facts given per URL; fingerprint.take records whom it asked."""
    asked: list[str] = []

    async def probe(client: Any, url: str) -> Any:
        return compat.InstanceFacts(url=url, **by_url[url])

    async def take(client: Any, url: str, model: str | None) -> Any:
        asked.append(url)
        return None

    monkeypatch.setattr(compat, "probe", probe)
    monkeypatch.setattr(compat.fingerprint, "take", take)
    return asked


A, B = "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"


def test_no_fingerprint_prompt_when_the_facts_differ_across_a_store(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A float16 decode sharing a store with a bfloat16 prefill died loading the prompt's KV
    (#48): when the facts already refuse, no prompt goes to instances with a connector."""
    asked = _facts_stub(monkeypatch, **{
        A: {"dtype": "bfloat16", "connector": "shared", "kv_role": "kv_producer"},
        B: {"dtype": "float16", "connector": "shared", "kv_role": "kv_consumer"}})
    result = asyncio.run(compat.compare([A, B]))
    assert asked == []
    assert [m.field for m in result.mismatches] == ["dtype"]


def test_an_unknown_connector_counts_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _facts_stub(monkeypatch, **{A: {"dtype": "bfloat16", "connector": "none"},
                                        B: {"dtype": "float16"}})
    asyncio.run(compat.compare([A, B]))
    assert asked == []


def test_without_connectors_the_numbers_are_still_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _facts_stub(monkeypatch, **{A: {"cache_dtype": "f16", "connector": "none"},
                                        B: {"cache_dtype": "q8_0", "connector": "none"}})

    async def alive(*_: Any) -> None:
        return None

    monkeypatch.setattr(compat, "_still_answers", alive)
    asyncio.run(compat.compare([A, B]))
    assert asked == [A, B]


def test_an_instance_that_dies_during_the_check_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing answers on these ports: after its fingerprint probe the first instance is
    found dead, and the check stops naming it rather than comparing what it cannot read."""
    _facts_stub(monkeypatch, **{A: {"connector": "none"}, B: {"connector": "none"}})
    with pytest.raises(compat.UnreachableError, match=re.escape(f"instance {A} died")):
        asyncio.run(compat.compare([A, B]))
