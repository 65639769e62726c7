"""vLLM's shared-directory KV store (ExampleConnector) on disk: its entries, whether each one
is whole, and whether the store's filesystem has room for a run.

ExampleConnector keeps one directory per prompt (the 32-hex-digit hash of its block-aligned
token ids) holding one safetensors file per attention layer, written layer by layer as the
forward pass runs, with no temporary name. An engine that dies mid-entry (a full filesystem:
`No space left on device (os error 28)`) leaves the directory with some layers only; the
connector takes any existing directory for a hit, so the next engine that meets the same
prompt dies loading the missing layer (`FileNotFoundError ... model.layers.2...`). So an entry
is whole when it holds every layer file and each file is as long as its own header says.

The number of layers comes from the model's config when the caller knows it, else from the
store itself (the most layer files any entry holds). This module starts nothing; it removes
entries only when a run asks (`remove_entries`, `drain`: each entry is read by decode as its
request crosses, and by no later request), and `engines/cleanup.py` removes whole stores.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvlab.core import RefusedError, tree_bytes
from kvlab.engines.base import Room, StoreMatch

ENTRY = re.compile(r"^[0-9a-f]{32}$")
LAYER_FILE = re.compile(r"\.(\d+)\.[\w.]*safetensors$")  # model.layers.N.self_attn.attn....
_HEADER_LIMIT = 1 << 24  # a safetensors header is kilobytes; more is not one


def is_entry(path: Path) -> bool:
    """An ExampleConnector entry: a hash-named directory holding only .safetensors files."""
    return (path.is_dir() and not path.is_symlink() and bool(ENTRY.match(path.name))
            and all(p.suffix == ".safetensors" for p in path.iterdir()))


def remove_entries(store: Path) -> int:
    """Remove the store's entries (nothing else a user keeps there); how many went."""
    return drain(store)[0]


def drain(store: Path) -> tuple[int, int]:
    """Remove the store's entries; how many went and their bytes."""
    entries = [p for p in store.iterdir() if is_entry(p)] if store.is_dir() else []
    size = 0
    for entry in entries:
        size += tree_bytes(entry)
        shutil.rmtree(entry, ignore_errors=True)
    return len(entries), size


def whole_file(path: Path) -> bool:
    """A safetensors file as long as its header says (8-byte length, JSON header, data)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return False
            length = int(struct.unpack("<Q", raw)[0])
            if length > _HEADER_LIMIT:
                return False
            header = json.loads(f.read(length))
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError):
        return False
    if not isinstance(header, dict):
        return False
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items()
                if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v]
    except (TypeError, ValueError, IndexError, KeyError):
        return False
    return size == 8 + length + max(ends, default=0)


@dataclass(frozen=True)
class Partial:
    """An entry an engine cannot load, and why."""

    path: Path
    why: str


def _layers(entry: Path) -> list[Path]:
    return sorted(entry.glob("*.safetensors"))


def partial_entries(store: Path, layers: int | None = None) -> list[Partial]:
    """The entries of `store` that miss a layer file or hold a cut-short one; `layers` is the
    model's attention layer count (None: the most any entry holds)."""
    if not store.is_dir():
        return []
    entries = {e: _layers(e) for e in sorted(store.iterdir()) if is_entry(e)}
    expected = layers or max((len(files) for files in entries.values()), default=0)
    out = []
    for entry, files in entries.items():
        if len(files) < expected:
            out.append(Partial(entry, f"{len(files)} of {expected} layer files"
                                      + _missing(files, expected)))
        elif cut := [f.name for f in files if not whole_file(f)]:
            out.append(Partial(entry, f"{cut[0]} is cut short"))
    return out


def _missing(files: list[Path], expected: int) -> str:
    """Which layer numbers are absent, when the names carry them."""
    have = {int(m.group(1)) for f in files if (m := LAYER_FILE.search(f.name))}
    gone = [str(n) for n in range(expected) if n not in have]
    return f", layer {', '.join(gone[:4])}{' …' if len(gone) > 4 else ''} missing" \
        if gone and len(have) == len(files) else ""


def model_layers(model: str) -> int | None:
    """The attention layer count a model directory's config.json states (None: unknown)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    inner = config.get("text_config")
    found = config.get("num_hidden_layers") or (
        inner.get("num_hidden_layers") if isinstance(inner, dict) else None)
    return found if isinstance(found, int) and found > 0 else None


def stores_named(kv_store: str | None) -> list[Path]:
    """The store directories an instance's `kv_store` fact names ("ExampleConnector store
    /path", as `adapter.argv_facts` writes it)."""
    return [Path(p) for p in (kv_store or "").split(" store ")[1:] if p]


def read_only_message(store: Path) -> str | None:
    """Why `store` cannot take the KV instances write (a read-only filesystem), or None."""
    if not store.is_dir() or not os.statvfs(store).f_flag & os.ST_RDONLY:
        return None
    return (f"the KV store {store} is on a read-only filesystem: the first KV an instance "
            "writes there kills it (vLLM's engine core dies on the failed write, and every "
            "instance sharing the store with it); remount it read-write or set "
            "KV_SHARED_PATH to a writable directory")


def partial_message(store: Path, layers: int | None = None) -> str | None:
    """Why `store` must not be served (it is read-only, or holds a partial entry), or None."""
    if (read_only := read_only_message(store)) is not None:
        return read_only
    found = partial_entries(store, layers)
    if not found:
        return None
    first = found[0]
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return (f"the KV store {store} holds a partial entry: {first.path.name} ({first.why})"
            f"{more}, left by an engine that died writing it (a full filesystem, a kill); "
            "vLLM takes the directory for a hit and dies loading the missing layer; `kvlab "
            "clean` removes ExampleConnector entries from KV_SHARED_PATH, or remove that "
            "directory")


def refuse_partial(store: Path, layers: int | None = None) -> None:
    """Refuse a store holding partial entries: an engine that meets one dies loading it."""
    if (why := partial_message(store, layers)) is not None:
        raise RefusedError(why)


def room(store: Path, requests: int, bytes_per_request: float) -> Room:
    """Free space on the filesystem `store` is on (its nearest existing parent) against
    `requests` entries of `bytes_per_request` each."""
    where = store
    while not where.exists() and where.parent != where:
        where = where.parent
    free = shutil.disk_usage(where).free
    return Room(store, free, int(requests * bytes_per_request), requests, bytes_per_request)


def require_room(store: Path, requests: int, bytes_per_request: float) -> Room:
    """`room`, refused when the run would not fit."""
    found = room(store, requests, bytes_per_request)
    if not found.enough:
        raise RefusedError(found.refusal())
    return found


def entry_name(prompt_ids: Sequence[int], block: int, *, lookup: bool) -> str:
    """The entry ExampleConnector names for a prompt (vLLM's example_connector.py, read, not
    copied): the md5 of its first whole blocks' token ids as 64-bit integers. Storing, it
    keeps (n - 1) // block whole blocks of the n prompt tokens; looking a prompt up, it keeps
    (n - 2) // block, as if the prompt's last token were a reply's. So a prompt finds only an
    entry made from the same whole blocks, never one of a shorter prefix of it."""
    count = len(prompt_ids) - (1 if lookup else 0)
    keep = max(0, (count - 1) // block * block)
    data = struct.pack(f"<{keep}q", *prompt_ids[:keep])
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def entry_names(store: Path) -> list[str]:
    """The store's entries by name, oldest first."""
    if not store.is_dir():
        return []
    found = [p for p in store.iterdir() if is_entry(p)]
    return [p.name for p in sorted(found, key=lambda p: p.stat().st_mtime)]


class ExampleStore:
    """The shared connector's store (vLLM's ExampleConnector directory) as `base.KvStore`."""

    def drain(self, store: Path) -> tuple[int, int]:
        return drain(store)

    def partial(self, store: Path, layers: int | None = None) -> str | None:
        return partial_message(store, layers)

    def named(self, kv_store: str | None) -> list[Path]:
        return stores_named(kv_store)

    def require_room(self, store: Path, requests: int, bytes_per_request: float) -> Room:
        return require_room(store, requests, bytes_per_request)

    def match(self, store: Path, prompts: Sequence[Sequence[int]], block: int) -> StoreMatch:
        names = entry_names(store)
        return StoreMatch(names, [entry_name(p, block, lookup=False) for p in prompts],
                          [entry_name(p, block, lookup=True) for p in prompts])


EXAMPLE_STORE = ExampleStore()
