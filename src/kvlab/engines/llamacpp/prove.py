"""`kvlab prove` against two llama-servers: their shared store is the slot directory.

llama-server instances share nothing unless a slot file moves between them, so the
two-endpoint proof is the slot store's round trip (`roundtrip.py`): cold on A (slot 0), save
A's slot 0 with kvlab's manifest, restore it into B's slot 0 (after the manifest check against
B), the identical prompt on B's slot 0, and a changed-prefix control on B's slot 1. Each
request is one of prove's cases, judged as prove judges every case; the round trip as a whole
is judged by `roundtrip.judge` and explained. The growing-conversation case belongs to vLLM's
connectors and is not run here. The slot file is removed afterwards: it holds the prompt.

This module does not import `measure/prove`: the llama.cpp adapter offers `slot_store_proof` as
its two-endpoint proof, and prove runs it with its `CaseRunner` (`engines/base.py`).
"""

from __future__ import annotations

import contextlib

from kvlab.core import RefusedError, Settings, server_root
from kvlab.engines.base import CaseRunner
from kvlab.engines.llamacpp import roundtrip, slotstore
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget, target_from_settings
from kvlab.observe import LOGPROB_TOLERANCE, ChatResult

LOGPROBS: dict[str, object] = {"logprobs": True, "top_logprobs": 5}  # for the logprob evidence
IDENTICAL_WHY = "the slot file saved on A was restored into this slot of B"
CONTROL_WHY = "the first words differ, and slot 1 never held this prompt"


def target_for(settings: Settings, url: str) -> LlamaTarget:
    """What kvlab knows of the llama-server at `url` (its serve record, else the settings)."""
    port = int(server_root(url).rsplit(":", 1)[-1])
    return target_from_settings(settings, port)


async def slot_store_proof(runner: CaseRunner, a: str, b: str, settings: Settings) -> None:
    """Save on A, restore on B, the identical prompt and a control on B; then the judgement."""
    ta, tb = target_for(settings, a), target_for(settings, b)
    if ta.slot_dir.resolve() != tb.slot_dir.resolve():
        raise RefusedError(f"the two llama-servers save slots in different directories "
                           f"({ta.slot_dir} and {tb.slot_dir}); start both with the same "
                           "LLAMA_SLOT_SAVE_PATH so a slot file can move between them")
    store = slotstore.SlotStore(ta.slot_dir)
    name = f"kvlab-prove-{runner.nonce}.bin"

    async def cold() -> ChatResult:
        return (await runner.cold("cold-on-a", a, id_slot=0, **LOGPROBS)).result

    async def again() -> ChatResult:
        return (await runner.identical("identical-on-b", b, IDENTICAL_WHY, id_slot=0,
                                       **LOGPROBS)).result

    async def control() -> ChatResult:
        return (await runner.control("changed-prefix-on-b", b, CONTROL_WHY, id_slot=1)).result

    try:
        async with LlamaClient(ta) as client_a, LlamaClient(tb) as client_b:
            trip = await roundtrip.round_trip(
                store, name, roundtrip.Slot(client_a, 0), roundtrip.Slot(client_b, 0),
                roundtrip.Asks(cold, again, control),
                say=lambda text: runner.say(f"    slot file: {text}"))
    finally:
        with contextlib.suppress(OSError):
            store.remove(name)
    runner.explain(
        "llama-server: the slot file saved on A and restored on B is the shared store; "
        "kvlab's manifest checked the model hash, KV types, slots and build first")
    runner.explain(_explained(roundtrip.judge(trip.cold, trip.control, trip.restored)))


def _explained(judged: roundtrip.Judgement) -> str:
    gap = f"{judged.logprob_gap:.2e}" if judged.logprob_gap is not None else "none"
    why = f": {'; '.join(judged.reasons)}" if judged.reasons else ""
    return (f"slot-store round trip A -> B: {judged.verdict} (first-token logprob gap {gap}, "
            f"tolerance {LOGPROB_TOLERANCE}){why}")
