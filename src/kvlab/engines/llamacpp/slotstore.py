"""The safe slot store: llama-server slot files, each with a kvlab manifest beside it.

llama-server restores any slot file whose KV shapes fit, even one saved from another model,
and then answers with wrong logits; its own failures are a generic HTTP 400. So kvlab writes
`NAME.kvlab.json` beside every file it saves (model file sha256, KV types, --parallel,
flash-attention mode, llama-server build, token count, kvlab version, and the file's own size
and sha256) and refuses a restore whose manifest does not match the running server, naming
the field. The store is private (directory 0700, files 0600) and takes bare file names only.

The sha256 of a GGUF (gigabytes) is cached by path, size and mtime. This module does not start
servers; the HTTP calls are `client.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from kvlab import __version__
from kvlab.core.errors import InputError, RefusedError
from kvlab.engines import llamacpp
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget, SlotOp
from kvlab.engines.process import make_private_dir
from kvlab.records import notebook

MANIFEST_SUFFIX = ".kvlab.json"
MANIFEST_SCHEMA = 1
# what must be equal for a slot file to mean the same thing on another server
MATCHED = ("model_sha256", "kv_type_k", "kv_type_v", "parallel", "flash_attn", "server_build")
_WHY = {
    "model_sha256": "a file from another model restores silently and gives wrong logits",
    "kv_type_k": "the key type (-ctk) must match", "kv_type_v": "the value type (-ctv) must match",
    "parallel": "--parallel sets the file's stream count",
    "flash_attn": "flash attention changes the V layout",
    "server_build": "slot files do not carry across llama.cpp builds",
}
_HASH_CACHE_KEEP = 256
_MTIME_SLACK_NS = 2_000_000_000  # coarse file-system timestamps


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


@dataclass(frozen=True)
class ServerIdentity(SavedWith):
    """One running server: what its slot files depend on, and how many tokens a slot holds."""

    tokens_per_slot: int

    def saved_with(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(SavedWith)}


@dataclass(frozen=True)
class Manifest(SavedWith):
    """The record kept beside one slot file (flat JSON: the server's fields, then the file's)."""

    filename: str
    n_tokens: int
    file_bytes: int
    file_sha256: str
    file_mtime_ns: int
    saved_from_slot: int
    kvlab_version: str
    saved_at: str
    schema: int = MANIFEST_SCHEMA

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: Path) -> Manifest:
        values: dict[str, Any] = {}
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
            values[f.name] = value
        return cls(**values)


def file_sha256(path: Path, cache: Path | None = None) -> str:
    """sha256 of a file, remembered by (path, size, mtime) in `cache` so a GGUF is read once."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    known = _read_cache(cache)
    if key in known:
        return known[key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    if cache is not None:
        known[key] = value
        _write_private_json(cache, dict(list(known.items())[-_HASH_CACHE_KEEP:]))
    return value


def _read_cache(cache: Path | None) -> dict[str, str]:
    if cache is None:
        return {}
    try:
        raw = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def _write_private_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file + rename) with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        Path(tmp).chmod(0o600)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def identity_of(client: LlamaClient, hash_cache: Path | None = None) -> ServerIdentity:
    """The running server's identity: /props and /slots, plus what its target knows."""
    props = await client.props()
    slots = await client.slots()
    # hashing a multi-GB GGUF the first time must not stall the event loop
    return await asyncio.to_thread(_identity, client.target, props, slots, hash_cache)


def _identity(target: LlamaTarget, props: dict[str, Any], slots: list[dict[str, Any]],
              hash_cache: Path | None) -> ServerIdentity:
    model_path = str(props.get(llamacpp.PROPS_MODEL_PATH, ""))
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
    return ServerIdentity(
        model_path=model_path, model_sha256=file_sha256(Path(model_path), hash_cache),
        kv_type_k=target.kv_type_k, kv_type_v=target.kv_type_v,
        parallel=int(props.get(llamacpp.PROPS_SLOTS, len(slots))),
        flash_attn=target.flash_attn, server_build=str(props.get(llamacpp.PROPS_BUILD, "")),
        tokens_per_slot=min(int(s.get(llamacpp.SLOT_N_CTX, 0)) for s in slots) if slots else 0,
    )


def mismatches(manifest: Manifest, identity: ServerIdentity) -> list[tuple[str, Any, Any]]:
    """(field, file's value, server's value) for every field that must match and does not."""
    return [(name, getattr(manifest, name), getattr(identity, name)) for name in MATCHED
            if getattr(manifest, name) != getattr(identity, name)]


@dataclass(frozen=True)
class StoreEntry:
    """One file in the store as `kvlab llama slots` lists it."""

    filename: str
    bytes: int
    manifest: Manifest | None


class SlotStore:
    """One slot directory (llama-server's --slot-save-path) and its manifests."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.expanduser()

    def ensure(self) -> None:
        make_private_dir(self.directory)

    def slot_path(self, name: str) -> Path:
        llamacpp.check_slot_filename(name)
        if name.endswith(MANIFEST_SUFFIX):
            raise RefusedError(f"slot file name {name!r} may not end in {MANIFEST_SUFFIX}: "
                               "kvlab keeps its manifests under such names")
        return self.directory / name

    def manifest_path(self, name: str) -> Path:
        return self.slot_path(name).with_name(name + MANIFEST_SUFFIX)

    def remove(self, name: str) -> None:
        """Remove a slot file and its manifest, if there (they hold the prompt)."""
        self.slot_path(name).unlink(missing_ok=True)
        self.manifest_path(name).unlink(missing_ok=True)

    def read_manifest(self, name: str) -> Manifest:
        """The manifest of an existing slot file; refuses a missing file or manifest."""
        path = self.slot_path(name)
        if not path.is_file():
            raise InputError(f"slot file {name} is not in {self.directory}; "
                             "`kvlab llama slots` lists the saved files")
        mpath = self.manifest_path(name)
        try:
            raw = json.loads(mpath.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RefusedError(
                f"{name} has no kvlab manifest ({mpath.name}), so the model that saved it cannot "
                "be verified; save it again with `kvlab llama save`"
            ) from None
        except (OSError, ValueError) as exc:
            raise InputError(f"manifest {mpath} cannot be read ({exc})") from None
        if not isinstance(raw, dict):
            raise InputError(f"manifest {mpath} is not a JSON object; save the slot again")
        return Manifest.from_dict(raw, mpath)

    def record(self, op: SlotOp, identity: ServerIdentity, hash_cache: Path | None,
               not_before_ns: int = 0) -> Manifest:
        """After a save: check the file is the one just written, make it private, describe it.

        `not_before_ns` (wall clock before the save) tells a fresh file from a stale one of the
        same name left in this directory while the server wrote somewhere else.
        """
        assert op.filename is not None
        path = self.slot_path(op.filename)
        fresh = path.is_file() and path.stat().st_mtime_ns >= not_before_ns - _MTIME_SLACK_NS \
            and (op.n_bytes is None or path.stat().st_size == op.n_bytes)
        if not fresh:
            raise RefusedError(
                f"the server saved {op.filename}, but not into {self.directory}: it runs with "
                "another --slot-save-path; set LLAMA_SLOT_SAVE_PATH to match"
            )
        # the server creates the file with its umask; the 0700 directory guards it until here
        path.chmod(0o600)
        st = path.stat()
        manifest = Manifest(
            **identity.saved_with(), filename=op.filename, n_tokens=op.n_tokens,
            file_bytes=st.st_size,
            file_sha256=file_sha256(path), file_mtime_ns=st.st_mtime_ns,
            saved_from_slot=op.slot, kvlab_version=__version__, saved_at=notebook.now_stamp(),
        )
        _write_private_json(self.manifest_path(op.filename), asdict(manifest))
        return manifest

    def check_restorable(self, name: str, identity: ServerIdentity) -> Manifest:
        """Every check before a restore; refuses naming the field that differs."""
        manifest = self.read_manifest(name)
        wrong = mismatches(manifest, identity)
        if wrong:
            field, saved, running = wrong[0]
            more = f" (also {', '.join(w[0] for w in wrong[1:])})" if wrong[1:] else ""
            raise RefusedError(
                f"refusing to restore {name}: {field} differs{more}: the file was saved with "
                f"{_shown(field, saved, manifest.model_path)}, this server has "
                f"{_shown(field, running, identity.model_path)}; {_WHY[field]}"
            )
        self._check_unchanged(name, manifest)
        if manifest.n_tokens > identity.tokens_per_slot:
            raise RefusedError(
                f"refusing to restore {name}: it holds {manifest.n_tokens} tokens but a slot of "
                f"this server holds {identity.tokens_per_slot} (tokens_per_slot = CTX / "
                "--parallel); raise CTX"
            )
        return manifest

    def _check_unchanged(self, name: str, manifest: Manifest) -> None:
        path = self.slot_path(name)
        st = path.stat()
        same = st.st_size == manifest.file_bytes and (
            st.st_mtime_ns == manifest.file_mtime_ns or file_sha256(path) == manifest.file_sha256)
        if not same:
            raise RefusedError(
                f"refusing to restore {name}: it changed after kvlab saved it (size or sha256 "
                "differ from its manifest), e.g. another server saved over it; save it again"
            )

    def entries(self) -> list[StoreEntry]:
        """The slot files in the store, with their manifests where present."""
        if not self.directory.is_dir():
            return []
        out = []
        for path in sorted(self.directory.iterdir()):
            if path.name.endswith(MANIFEST_SUFFIX) or not _is_slot_file(path):
                continue
            manifest = None
            with contextlib.suppress(InputError, RefusedError):
                manifest = self.read_manifest(path.name)
            out.append(StoreEntry(path.name, path.stat().st_size, manifest))
        return out


def _shown(field: str, value: Any, model_path: str) -> str:
    if field == "model_sha256":
        return f"model {Path(model_path).name} (sha256 {str(value)[:12]}…)"
    return f"{field} {value}"


def _is_slot_file(path: Path) -> bool:
    """A regular file that starts with llama.cpp's sequence-state magic."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(llamacpp.SLOT_FILE_MAGIC)) == llamacpp.SLOT_FILE_MAGIC
    except OSError:
        return False


@dataclass
class CleanResult:
    """What `clean` removed (or would remove) and what it left alone."""

    directory: str
    removed: list[str]
    bytes_freed: int
    kept: list[str]
    directory_removed: bool


def clean(directory: Path, *, dry_run: bool = False) -> CleanResult:
    """Remove slot files and kvlab manifests from a slot directory (for `kvlab clean`).

    Only files that start with llama.cpp's slot-file magic, and kvlab's manifests, are removed;
    anything else is listed as kept, so a mistaken LLAMA_SLOT_SAVE_PATH cannot wipe a folder.
    The directory itself goes when nothing is left in it.
    """
    directory = directory.expanduser()
    result = CleanResult(str(directory), [], 0, [], False)
    if not directory.is_dir():
        return result
    for path in sorted(directory.iterdir()):
        ours = _is_slot_file(path) or (path.name.endswith(MANIFEST_SUFFIX) and path.is_file()
                                       and not path.is_symlink())
        if not ours:
            result.kept.append(path.name)
            continue
        result.removed.append(path.name)
        result.bytes_freed += path.stat().st_size
        if not dry_run:
            path.unlink()
    if not dry_run and not result.kept:
        with contextlib.suppress(OSError):
            directory.rmdir()
            result.directory_removed = True
    return result


async def save(client: LlamaClient, store: SlotStore, slot: int, name: str,
               hash_cache: Path | None = None) -> tuple[SlotOp, Manifest]:
    """Save `slot` as `name` with its manifest; the old manifest goes first, never stale."""
    store.slot_path(name)
    await client.check_slot(slot)
    identity = await identity_of(client, hash_cache)
    store.ensure()
    store.manifest_path(name).unlink(missing_ok=True)
    started_ns = time.time_ns()
    op = await client.save(slot, name)
    return op, await asyncio.to_thread(store.record, op, identity, hash_cache, started_ns)


async def restore(client: LlamaClient, store: SlotStore, slot: int, name: str,
                  hash_cache: Path | None = None) -> tuple[SlotOp, Manifest]:
    """Restore `name` into `slot` after every manifest check has passed."""
    store.slot_path(name)
    await client.check_slot(slot)
    identity = await identity_of(client, hash_cache)
    manifest = await asyncio.to_thread(store.check_restorable, name, identity)
    return await client.restore(slot, name), manifest
