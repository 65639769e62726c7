"""The slot store's manifest: what a slot file depends on, as kvlab records it beside the file.

llama-server restores any slot file whose KV shapes fit, even one saved from another model,
and then answers with wrong logits. So kvlab writes `NAME.kvlab.json` beside every file it
saves: the server's side (`SavedWith`: model file sha256, KV types, flash attention as the
build resolved it, the unified-cache switch and the cache's stream count, --parallel,
llama-server build) and the file's (token count, kvlab version, and the file's own size,
sha256, inode and ctime). `mismatches` names every field of `MATCHED` on which a manifest and a
running server (`ServerIdentity`) differ; a fact that cannot be read is "unknown" and refuses
nothing. A manifest of schema 1 took its KV types and flash-attention mode from settings: they
are read as unknown. A manifest must be a small flat JSON object whose `filename` is its own
slot file's name and whose counts are not negative.

Deliberately not here: reading the running server's identity (`slotidentity.py`), opening and
hashing the store's files (`slotfiles.py`), and the store's operations and refusals
(`slotstore.py`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pydantic import TypeAdapter

from kvlab.core import VERSION, InputError
from kvlab.engines.llamacpp.client import SlotOp
from kvlab.engines.llamacpp.slotfacts import UNKNOWN
from kvlab.records import notebook

MANIFEST_SUFFIX = ".kvlab.json"
MANIFEST_SCHEMA = 2
# what must be equal for a slot file to mean the same thing on another server ("unknown" on
# either side is not compared)
MATCHED = ("model_sha256", "kv_type_k", "kv_type_v", "n_stream", "flash_attn", "server_build")
# schema 1 took these from kvlab's settings, not the server: read as unknown
_SETTINGS_FIELDS = ("kv_type_k", "kv_type_v", "flash_attn")
_ADDED_IN_2 = {"kv_unified": UNKNOWN, "n_stream": UNKNOWN, "file_inode": 0, "file_ctime_ns": 0}
# counts a manifest holds that cannot be negative
_NOT_NEGATIVE = ("n_tokens", "file_bytes", "file_mtime_ns", "saved_from_slot", "parallel",
                 "file_inode", "file_ctime_ns")


@dataclass(frozen=True)
class SavedWith:
    """What a slot file depends on: the server that saves it and the one that restores it."""

    model_path: str
    model_sha256: str
    kv_type_k: str
    kv_type_v: str
    parallel: int
    flash_attn: str
    server_build: str
    kv_unified: str = UNKNOWN
    n_stream: str = UNKNOWN


@dataclass(frozen=True)
class ServerIdentity(SavedWith):
    """One running server: what its slot files depend on, and how many tokens a slot holds."""

    tokens_per_slot: int = 0
    facts_from: str = ""  # where the KV facts were read (`slotfacts.read`)

    def saved_with(self) -> SavedWith:
        return SavedWith(**{f.name: getattr(self, f.name) for f in fields(SavedWith)})


@dataclass(frozen=True)
class Manifest(SavedWith):
    """The record kept beside one slot file (flat JSON: the server's fields, then the file's)."""

    filename: str = ""
    n_tokens: int = 0
    file_bytes: int = 0
    file_sha256: str = ""
    file_mtime_ns: int = 0
    saved_from_slot: int = 0
    kvlab_version: str = ""
    saved_at: str = ""
    file_inode: int = 0  # with file_ctime_ns: kvlab's own unchanged file (0: not recorded)
    file_ctime_ns: int = 0
    schema: int = MANIFEST_SCHEMA

    @classmethod
    def of(cls, saved: SavedWith, op: SlotOp, st: os.stat_result, digest: str) -> Manifest:
        """The manifest of the slot file `op` saved, `st` its stat and `digest` its sha256."""
        assert op.filename is not None, "a save names its file"
        return cls(**asdict(saved), filename=op.filename, n_tokens=op.n_tokens,
                   file_bytes=st.st_size, file_sha256=digest, file_mtime_ns=st.st_mtime_ns,
                   saved_from_slot=op.slot, kvlab_version=VERSION,
                   saved_at=notebook.now_stamp(), file_inode=st.st_ino,
                   file_ctime_ns=st.st_ctime_ns)

    @classmethod
    def from_dict(cls, raw: dict[str, object], where: Path) -> Manifest:
        if raw.get("schema", 1) == 1:  # an older kvlab's: see _SETTINGS_FIELDS
            raw = {**_ADDED_IN_2, **raw, **dict.fromkeys(_SETTINGS_FIELDS, UNKNOWN)}
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name not in raw:
                if f.name == "schema":
                    continue
                raise InputError(f"manifest {where} lacks {f.name}; save the slot again")
            value, wanted = raw[f.name], int if f.type == "int" else str
            if not isinstance(value, wanted) or isinstance(value, bool):
                kind = "a whole number" if wanted is int else "text"
                raise InputError(f"manifest {where}: {f.name} should be {kind}; "
                                 "save the slot again")
            if f.name in _NOT_NEGATIVE and isinstance(value, int) and value < 0:
                raise InputError(f"manifest {where}: {f.name} is {value}, below 0; "
                                 "save the slot again")
            values[f.name] = value
        manifest = _MANIFEST.validate_python(values)  # every value checked above
        if where.name != manifest.filename + MANIFEST_SUFFIX:
            raise InputError(f"manifest {where} describes another file "
                             f"({manifest.filename!r}); save the slot again")
        return manifest


_MANIFEST = TypeAdapter(Manifest)


def mismatches(manifest: Manifest,
               identity: ServerIdentity) -> list[tuple[str, object, object]]:
    """(field, file's value, server's value) for every field that must match and does not;
    a value unknown on either side is not compared."""
    pairs = [(name, getattr(manifest, name), getattr(identity, name)) for name in MATCHED]
    return [(name, saved, running) for name, saved, running in pairs
            if saved != running and UNKNOWN not in (saved, running)]
