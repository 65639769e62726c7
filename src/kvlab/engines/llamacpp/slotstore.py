"""The safe slot store: llama-server slot files, each with a kvlab manifest beside it.

llama-server restores any slot file whose KV shapes fit, even one saved from another model,
and then answers with wrong logits; its own failures are a generic HTTP 400. So kvlab writes
`NAME.kvlab.json` beside every file it saves (model file sha256, KV types, flash attention as
the build resolved it, the unified-cache switch and the cache's stream count, --parallel,
llama-server build, token count, kvlab version, and the file's own size, sha256, inode and
ctime) and refuses a restore whose manifest does not match the running server, naming the
field. The server's facts are read from the server (`slotfacts.py`: its log, else its command
line), never from kvlab's settings; a fact that cannot be read is "unknown" and refuses
nothing. A manifest of schema 1 took its KV types and flash-attention mode from settings:
they are read as unknown. The store is private (a directory kvlab creates 0700, files 0600)
and takes bare file names only; a symlink in it is refused, never followed (files are opened
O_NOFOLLOW), so a link planted there cannot be chmod-ed, hashed or restored.

Before a restore the file must still be the one saved: the same size, and the same sha256
unless it is provably kvlab's own unchanged file: the same inode, size and ctime as the
manifest recorded after the save (any write, rename over it, `touch` or chmod moves the ctime,
which no user can set back; mtimes can be set back, so they prove nothing). A manifest must be
a small flat JSON object whose `filename` is its own slot file's name and whose counts are not
negative.

The sha256 of a GGUF (gigabytes) is cached by path, inode, size and ctime. This module does not
start servers; the HTTP calls are `client.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pydantic import TypeAdapter

from kvlab import __version__
from kvlab.core import InputError, RefusedError, integer, write_private
from kvlab.engines import llamacpp, local
from kvlab.engines.llamacpp import slotfacts
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget, SlotOp
from kvlab.engines.llamacpp.facts import SERVER_BINARY
from kvlab.engines.llamacpp.slotfacts import UNKNOWN
from kvlab.engines.private_dirs import make_private_dir
from kvlab.records import notebook

MANIFEST_SUFFIX = ".kvlab.json"
MANIFEST_SCHEMA = 2
# what must be equal for a slot file to mean the same thing on another server ("unknown" on
# either side is not compared)
MATCHED = ("model_sha256", "kv_type_k", "kv_type_v", "n_stream", "flash_attn", "server_build")
_WHY = {
    "model_sha256": "a file from another model restores silently and gives wrong logits",
    "kv_type_k": "the key type (-ctk) must match", "kv_type_v": "the value type (-ctv) must match",
    "n_stream": "the cache's stream count must match (one per slot with --parallel, one for "
                "all with -kvu); llama.cpp refuses it as n_stream mismatch",
    "flash_attn": "flash attention (as the build resolved it) changes the V layout",
    "server_build": "slot files do not carry across llama.cpp builds",
}
# schema 1 took these from kvlab's settings, not the server: read as unknown
_SETTINGS_FIELDS = ("kv_type_k", "kv_type_v", "flash_attn")
_SERVER_FACTS = (*_SETTINGS_FIELDS, "n_stream")  # read by `slotfacts`
_ADDED_IN_2 = {"kv_unified": UNKNOWN, "n_stream": UNKNOWN, "file_inode": 0, "file_ctime_ns": 0}
_HASH_CACHE_KEEP = 256
_MTIME_SLACK_NS = 2_000_000_000  # coarse file-system timestamps
_MANIFEST_MAX_BYTES = 1 << 20  # a manifest is a few hundred bytes
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
                   saved_from_slot=op.slot, kvlab_version=__version__,
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


def file_sha256(path: Path, cache: Path | None = None) -> str:
    """sha256 of a file, remembered by (path, inode, size, ctime) in `cache` so a GGUF is read
    once; a file swapped in with its mtime set back has another ctime (or inode)."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_ctime_ns}"
    known = _read_cache(cache)
    if key in known:
        return known[key]
    with open(path, "rb") as f:
        value = _sha256_of(f.fileno())
    if cache is not None:
        known[key] = value
        _write_private_json(cache, dict(list(known.items())[-_HASH_CACHE_KEEP:]))
    return value


def _sha256_of(fd: int) -> str:
    """sha256 of an open file, read from its start."""
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    for block in iter(lambda: os.read(fd, 1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _open_regular(path: Path, mode: int = os.O_RDONLY) -> Iterator[tuple[int, os.stat_result]]:
    """A store file opened without following a symlink, with its stat; refuses anything
    but a regular file."""
    try:
        fd = os.open(path, mode | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if path.is_symlink():
            raise RefusedError(
                f"{path.name} in {path.parent} is a symbolic link: kvlab reads and restores "
                "only files saved into the store; remove the link") from None
        raise InputError(f"{path} cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedError(f"{path.name} in {path.parent} is not a regular file; remove it")
        yield fd, st
    finally:
        os.close(fd)


def _read_cache(cache: Path | None) -> dict[str, str]:
    if cache is None:
        return {}
    try:
        raw = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def _write_private_json(path: Path, data: object) -> None:
    write_private(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


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
    parallel = integer(props.get(llamacpp.PROPS_SLOTS)) or len(slots)
    facts = server_facts(target, parallel)
    return ServerIdentity(
        model_path=model_path, model_sha256=file_sha256(Path(model_path), hash_cache),
        kv_type_k=facts.kv_type_k, kv_type_v=facts.kv_type_v, parallel=parallel,
        flash_attn=facts.flash_attn, server_build=str(props.get(llamacpp.PROPS_BUILD, "")),
        kv_unified=facts.kv_unified, n_stream=facts.n_stream,
        tokens_per_slot=min(integer(s.get(llamacpp.SLOT_N_CTX)) or 0 for s in slots) if slots
        else 0, facts_from=facts.source,
    )


def mismatches(manifest: Manifest,
               identity: ServerIdentity) -> list[tuple[str, object, object]]:
    """(field, file's value, server's value) for every field that must match and does not;
    a value unknown on either side is not compared."""
    pairs = [(name, getattr(manifest, name), getattr(identity, name)) for name in MATCHED]
    return [(name, saved, running) for name, saved, running in pairs
            if saved != running and UNKNOWN not in (saved, running)]


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


def _read_small(path: Path) -> str:
    """A manifest's text, read without following a symlink; refuses a huge one."""
    data = b""
    with _open_regular(path) as (fd, _):
        while len(data) <= _MANIFEST_MAX_BYTES and (block := os.read(fd, 1 << 16)):
            data += block
    if len(data) > _MANIFEST_MAX_BYTES:
        raise InputError(f"manifest {path} is larger than any kvlab manifest; save the slot "
                         "again")
    return data.decode("utf-8")


def _shown(field: str, value: object, model_path: str) -> str:
    if field == "model_sha256":
        return f"model {Path(model_path).name} (sha256 {str(value)[:12]}…)"
    if field == "flash_attn":
        return f"flash attention {value}"
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
