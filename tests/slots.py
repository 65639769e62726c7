"""A slot store's test inputs without a server: a fake GGUF, a slot file's magic, an identity."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvlab.engines.llamacpp.slotfiles import file_sha256
from kvlab.engines.llamacpp.slotmanifest import ServerIdentity

MAGIC = b"qsgg\x03\x00\x00\x00"  # what llama-server writes at the start of a slot file


def identity(model: Path, **changes: object) -> ServerIdentity:
    """A server that loaded `model`, with any field changed."""
    base = ServerIdentity(model_path=str(model), model_sha256=file_sha256(model),
                          kv_type_k="q8_0", kv_type_v="q8_0", parallel=2, flash_attn="on",
                          server_build="b1-0c1e570", kv_unified="false", n_stream="2",
                          tokens_per_slot=4096, facts_from="read from its log")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def fake_model(directory: Path) -> Path:
    path = directory / "m.gguf"
    path.write_bytes(b"GGUF tiny weights")
    return path
