"""The running llama-server's identity, as a slot file's manifest is checked against it.

From the server itself: /props (model path, build, slot count), /slots (tokens a slot holds),
the model file's sha256, and its KV facts (`slotfacts.py`: its log, else its command line),
never kvlab's settings; a fact that cannot be read is "unknown" and refuses nothing. A record
that names another model than the server reports is stale and refused, and so is a model file
that cannot be read here (its sha256 cannot be checked).

Deliberately not here: the manifest and the comparison (`slotmanifest.py`), the store
(`slotstore.py`), and the HTTP calls (`client.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from kvlab.core import RefusedError, integer
from kvlab.engines import local
from kvlab.engines.llamacpp import slotfacts
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget
from kvlab.engines.llamacpp.facts import (
    PROPS_BUILD,
    PROPS_MODEL_PATH,
    PROPS_SLOTS,
    SERVER_BINARY,
    SLOT_N_CTX,
)
from kvlab.engines.llamacpp.slotfiles import file_sha256
from kvlab.engines.llamacpp.slotmanifest import ServerIdentity


async def identity_of(client: LlamaClient, hash_cache: Path | None = None) -> ServerIdentity:
    """The running server's identity: /props, /slots, and its KV facts as it states them."""
    props = await client.props()
    slots = await client.slots()
    # hashing a multi-GB GGUF the first time must not stall the event loop
    return await asyncio.to_thread(_identity, client.target, props, slots, hash_cache)


def server_facts(target: LlamaTarget, slots: int) -> slotfacts.SlotFacts:
    """The KV facts of the server at `target`: its log's (when kvlab knows the log of this
    very server: it started it, or `kvlab llama serve` keeps its record), its command line's
    (when it runs here), else unknown. A log found only by the settings' port may be an older
    server's, so it is not read."""
    log = None
    if target.log_path is not None and target.source != "settings":
        with contextlib.suppress(OSError):
            log = target.log_path.read_text(encoding="utf-8", errors="replace")
    argv = local.listening_argv(target.base_url)
    if argv and Path(argv[0]).name != SERVER_BINARY:
        argv = None  # a wrapper or another program on the port: its flags say nothing
    return slotfacts.read(log, argv, slots)


def _identity(target: LlamaTarget, props: dict[str, object], slots: list[dict[str, object]],
              hash_cache: Path | None) -> ServerIdentity:
    model_path = str(props.get(PROPS_MODEL_PATH, ""))
    if target.model and Path(target.model).resolve() != Path(model_path).resolve():
        raise RefusedError(
            f"{target.source} says {target.base_url} loaded {target.model}, but the server "
            f"reports {model_path}: the record is stale; remove it or restart the server"
        )
    if not Path(model_path).is_file():
        raise RefusedError(
            f"the server's model file {model_path!r} is not readable here, so its sha256 "
            "cannot be checked: run kvlab on the machine the server runs on"
        )
    parallel = integer(props.get(PROPS_SLOTS)) or len(slots)
    facts = server_facts(target, parallel)
    return ServerIdentity(
        model_path=model_path, model_sha256=file_sha256(Path(model_path), hash_cache),
        kv_type_k=facts.kv_type_k, kv_type_v=facts.kv_type_v, parallel=parallel,
        flash_attn=facts.flash_attn, server_build=str(props.get(PROPS_BUILD, "")),
        kv_unified=facts.kv_unified, n_stream=facts.n_stream,
        tokens_per_slot=min(integer(s.get(SLOT_N_CTX)) or 0 for s in slots) if slots
        else 0, facts_from=facts.source,
    )
