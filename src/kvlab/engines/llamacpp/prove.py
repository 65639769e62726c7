"""`kvlab prove` against two llama-servers: their shared store is the slot directory.

llama-server instances share nothing unless a slot file moves between them, so the
two-endpoint proof is: cold on A (slot 0), save A's slot 0 with kvlab's manifest, restore it
into B's slot 0 (after the manifest check against B), the identical prompt on B's slot 0
(`timings.cache_n` must cover the prompt), and a changed-prefix control on B's slot 1. The
growing-conversation case belongs to vLLM's connectors and is not run here. The slot file is
removed afterwards: it holds the prompt.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from kvlab.core.errors import RefusedError
from kvlab.core.settings import Settings
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget, target_from_settings
from kvlab.measure.chat import server_root


def target_for(settings: Settings, url: str) -> LlamaTarget:
    """What kvlab knows of the llama-server at `url` (its serve record, else the settings)."""
    port = int(server_root(url).rsplit(":", 1)[-1])
    return target_from_settings(settings, port)


async def two_llama_endpoints(p: object, a: str, b: str, settings: Settings) -> None:
    """The slot-store proof; `p` is prove's case runner (kept untyped to avoid a cycle)."""
    from kvlab.measure.prove import REUSABLE, _Prover

    assert isinstance(p, _Prover)
    ta, tb = target_for(settings, a), target_for(settings, b)
    if ta.slot_dir.resolve() != tb.slot_dir.resolve():
        raise RefusedError(f"the two llama-servers save slots in different directories "
                           f"({ta.slot_dir} and {tb.slot_dir}); start both with the same "
                           "LLAMA_SLOT_SAVE_PATH so a slot file can move between them")
    store = slotstore.SlotStore(ta.slot_dir)
    name = f"kvlab-prove-{p.run.nonce}.bin"
    await p.cold("cold-on-a", a, id_slot=0)
    try:
        async with LlamaClient(ta) as client_a, LlamaClient(tb) as client_b:
            saved, _ = await slotstore.save(client_a, store, 0, name)
            restored, _ = await slotstore.restore(client_b, store, 0, name)
        p.say(f"    slot file: saved {saved.n_tokens} tokens in {saved.wall_ms:.1f} ms, "
              f"restored on B in {restored.wall_ms:.1f} ms")
        await p.case("identical-on-b", b, p.messages(p.run.nonce), REUSABLE, id_slot=0)
        await p.control("changed-prefix-on-b", b,
                        "the first words differ, and slot 1 never held this prompt", id_slot=1)
        p.run.explanations.append(
            "llama-server: the slot file saved on A and restored on B is the shared store; "
            "kvlab's manifest checked the model hash, KV types, slots and build first")
    finally:
        for path in (store.slot_path(name), store.manifest_path(name)):
            with contextlib.suppress(OSError):
                Path(path).unlink()  # noqa: ASYNC240 - two small local files
