"""The safe slot store: llama-server slot files, each with a kvlab manifest beside it.

llama-server restores any slot file whose KV shapes fit, even one saved from another model,
and then answers with wrong logits; its own failures are a generic HTTP 400. So kvlab writes a
manifest beside every file it saves (`slotmanifest.py`) and refuses a restore whose manifest
does not match the running server (`slotidentity.py`), naming the field. The store is private
(a directory kvlab creates 0700, files 0600) and takes bare file names only; a symlink in it
is refused, never followed (`slotfiles.py`).

Before a restore the file must still be the one saved: the same size, and the same sha256
unless it is provably kvlab's own unchanged file: the same inode, size and ctime as the
manifest recorded after the save (any write, rename over it, `touch` or chmod moves the ctime,
which no user can set back; mtimes can be set back, so they prove nothing).

This module owns the store's operations: `SlotStore` (paths, manifests read and recorded,
the checks before a restore, the listing), `clean`, `save` and `restore`. Deliberately not
here: the manifest's fields and schema (`slotmanifest.py`), the server's identity
(`slotidentity.py`), and reading, hashing and writing the files (`slotfiles.py`). This module
does not start servers; the HTTP calls are `client.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvlab.core import InputError, RefusedError
from kvlab.engines.llamacpp.client import LlamaClient, SlotOp
from kvlab.engines.llamacpp.facts import check_slot_filename
from kvlab.engines.llamacpp.slotfiles import (
    _is_slot_file,
    _open_regular,
    _read_small,
    _sha256_of,
    _write_private_json,
)
from kvlab.engines.llamacpp.slotidentity import identity_of
from kvlab.engines.llamacpp.slotmanifest import (
    _SETTINGS_FIELDS,
    MANIFEST_SUFFIX,
    Manifest,
    ServerIdentity,
    mismatches,
)
from kvlab.engines.private_dirs import make_private_dir

# why each field of `slotmanifest.MATCHED` must match: the last words of a refusal
_WHY = {
    "model_sha256": "a file from another model restores silently and gives wrong logits",
    "kv_type_k": "the key type (-ctk) must match", "kv_type_v": "the value type (-ctv) must match",
    "n_stream": "the cache's stream count must match (one per slot with --parallel, one for "
                "all with -kvu); llama.cpp refuses it as n_stream mismatch",
    "flash_attn": "flash attention (as the build resolved it) changes the V layout",
    "server_build": "slot files do not carry across llama.cpp builds",
}
_SERVER_FACTS = (*_SETTINGS_FIELDS, "n_stream")  # read by `slotfacts`
_MTIME_SLACK_NS = 2_000_000_000  # coarse file-system timestamps


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
        check_slot_filename(name)
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
        """The manifest of an existing slot file; refuses a missing file or manifest, and a
        symlink in place of either."""
        path = self.slot_path(name)
        try:
            with _open_regular(path):
                pass
        except FileNotFoundError:
            raise InputError(f"slot file {name} is not in {self.directory}; "
                             "`kvlab llama slots` lists the saved files") from None
        mpath = self.manifest_path(name)
        try:
            raw = json.loads(_read_small(mpath))
        except FileNotFoundError:
            raise RefusedError(
                f"{name} has no kvlab manifest ({mpath.name}), so the model that saved it cannot "
                "be verified; save it again with `kvlab llama save`"
            ) from None
        except RecursionError:
            raise InputError(f"manifest {mpath} is nested too deeply to be a kvlab manifest; "
                             "save the slot again") from None
        except ValueError as exc:
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
        elsewhere = RefusedError(
            f"the server saved {op.filename}, but not into {self.directory}: it runs with "
            "another --slot-save-path; set LLAMA_SLOT_SAVE_PATH to match")
        try:
            with _open_regular(path) as (fd, st):
                fresh = st.st_mtime_ns >= not_before_ns - _MTIME_SLACK_NS \
                    and (op.n_bytes is None or st.st_size == op.n_bytes)
                if not fresh:
                    raise elsewhere
                # the server creates the file with its umask; the directory guards it till here
                os.fchmod(fd, 0o600)
                st = os.fstat(fd)
                digest = _sha256_of(fd)
        except FileNotFoundError:
            raise elsewhere from None
        manifest = Manifest.of(identity.saved_with(), op, st, digest)
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
                f"{_shown(field, running, identity.model_path)}"
                + (f" ({identity.facts_from})" if field in _SERVER_FACTS and
                   identity.facts_from else "") + f"; {_WHY[field]}"
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
        """The file is the one saved: same size, and same sha256 unless provably untouched.

        Untouched means the inode, size and ctime the manifest recorded after the save's last
        chmod: any later write, rename over it, `touch -d` or chmod moves the ctime forward,
        and no user can set it back. mtimes prove nothing (a file's and its manifest's can
        both be set to anything), so a manifest without an inode (schema 1) is always hashed.
        """
        path = self.slot_path(name)
        with _open_regular(path) as (fd, st):
            untouched = bool(manifest.file_inode) and st.st_ino == manifest.file_inode \
                and st.st_ctime_ns == manifest.file_ctime_ns
            same = st.st_size == manifest.file_bytes and (
                untouched or _sha256_of(fd) == manifest.file_sha256)
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


def _shown(field: str, value: object, model_path: str) -> str:
    if field == "model_sha256":
        return f"model {Path(model_path).name} (sha256 {str(value)[:12]}…)"
    if field == "flash_attn":
        return f"flash attention {value}"
    return f"{field} {value}"


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
