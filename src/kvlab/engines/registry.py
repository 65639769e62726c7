"""Which engine is which: the adapters by name, and the engine a /metrics scrape is from.

The only module that imports every engine package's adapter, so `base.py` (the protocol the
adapters implement) imports none of them.
"""

from __future__ import annotations

from kvlab.engines.base import LLAMA_CPP, NAMES, VLLM, Engine
from kvlab.engines.llamacpp import facts as llamacpp_facts
from kvlab.engines.llamacpp.adapter import LLAMA_CPP_ENGINE
from kvlab.engines.vllm import facts as vllm_facts
from kvlab.engines.vllm.adapter import VLLM_ENGINE
from kvlab.observe import Snapshot, metrics
from kvlab.records import Deltas

ENGINES: dict[str, Engine] = {VLLM: VLLM_ENGINE, LLAMA_CPP: LLAMA_CPP_ENGINE}


def engine_for(name: str) -> Engine:
    """The adapter for an engine name as plans and records spell it."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; kvlab knows {', '.join(NAMES)}") from None


def known_engine(name: str) -> Engine | None:
    """The adapter for `name`, or None for a process that is no engine (kvlab's own proxy)."""
    return engine_for(name) if name in NAMES else None


def all_engines() -> list[Engine]:
    return [engine_for(name) for name in NAMES]


def source_of(snap: Snapshot | None) -> Engine | None:
    """The engine whose namespace a /metrics scrape uses (None: no engine kvlab knows)."""
    if snap is None:
        return None
    prefixes = snap.namespaces
    return next((e for e in all_engines() if e.metric_namespace in prefixes), None)


def evidence_deltas(before: Snapshot | None, after: Snapshot | None) -> Deltas:
    """The reuse counters' increases between two scrapes of one engine, by the evidence keys
    its adapter names (empty when either scrape is missing or no engine kvlab knows)."""
    return metrics.evidence_deltas(before, after, source_of(after))


def transfer_deltas(before: Snapshot | None, after: Snapshot | None) -> dict[str, float]:
    """KV moved between instances over two scrapes (NIXL's counters), by evidence key."""
    return metrics.transfer_deltas(before, after, source_of(after))


def failure_meaning(detail: str) -> str | None:
    """What an engine's error answer to a request means, in a few words, where its wording is
    one kvlab knows (None: say the engine's own words)."""
    if any(p in detail for p in (*vllm_facts.PROMPT_TOO_LONG, *llamacpp_facts.PROMPT_TOO_LONG)):
        return "the prompt exceeds the context"
    return None
