"""`kvlab llama slots|save|restore|erase` as library calls, against the llama-server at
LLAMA_PORT (or a port given): what each slot holds and which files the store keeps; a slot
saved with its manifest, restored after the manifest is checked against the server, erased.
Each returns what it did, with the server's own timing and the wall time around the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.core import JsonObject, Settings
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import LlamaClient, SlotOp, target_from_settings
from kvlab.engines.llamacpp.facts import SLOT_PROMPT_TOKENS
from kvlab.engines.llamacpp.slotmanifest import Manifest
from kvlab.engines.llamacpp.slotstore import SlotStore, StoreEntry


@dataclass
class Held:
    """What each slot of a server holds, and the store's files."""

    base_url: str
    slots: list[JsonObject]
    store: str
    files: list[StoreEntry] = field(default_factory=list)


@dataclass
class Done:
    """One slot action, and the manifest it wrote or checked."""

    op: SlotOp
    manifest: Manifest | None = None
    path: str | None = None
    config_source: str = ""


def _opened(settings: Settings, port: int | None) -> tuple[LlamaClient, SlotStore]:
    target = target_from_settings(settings, port)
    return LlamaClient(target, settings.api_key()), SlotStore(target.slot_dir)


async def held(settings: Settings, port: int | None = None) -> Held:
    client, store = _opened(settings, port)
    async with client:
        slots = await client.slots()
    return Held(client.target.base_url, slots, str(store.directory), store.entries())


async def save(settings: Settings, slot: int, filename: str, port: int | None = None) -> Done:
    client, store = _opened(settings, port)
    async with client:
        op, manifest = await slotstore.save(client, store, slot, filename,
                                            settings.paths().file_hashes)
    return Done(op, manifest, str(store.slot_path(filename)), client.target.source)


async def restore(settings: Settings, slot: int, filename: str,
                  port: int | None = None) -> Done:
    client, store = _opened(settings, port)
    async with client:
        op, manifest = await slotstore.restore(client, store, slot, filename,
                                               settings.paths().file_hashes)
    return Done(op, manifest, config_source=client.target.source)


async def erase(settings: Settings, slot: int, port: int | None = None) -> Done:
    client, _ = _opened(settings, port)
    async with client:
        await client.check_slot(slot)
        return Done(await client.erase(slot))


def holds(slot: JsonObject) -> str:
    """What a slot holds, as far as /slots says: this llama-server lists a slot's token count
    only once the slot has served a request, so a slot that was only restored into lists none
    (and is not empty)."""
    held_tokens = slot.get(SLOT_PROMPT_TOKENS)
    if held_tokens is None:
        return ("prompt tokens not reported (the server counts a slot's tokens only once it has "
                "served a request; a slot restored from a file is not counted)")
    return f"holds {held_tokens} prompt tokens"
