"""The slot store's files, touched safely: opened without following a symlink, read with a
size limit, told apart by llama.cpp's magic, hashed, and written private.

A store file is opened O_NOFOLLOW and must be a regular file, so a link planted in the store
cannot be chmod-ed, hashed or restored. The sha256 of a GGUF (gigabytes) is cached by path,
inode, size and ctime, so a model is read once; a file swapped in with its mtime set back has
another ctime (or inode).

Deliberately not here: what a manifest holds (`slotmanifest.py`) and the store's operations
(`slotstore.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from kvlab.core import InputError, RefusedError, write_private
from kvlab.engines.llamacpp.facts import SLOT_FILE_MAGIC

_HASH_CACHE_KEEP = 256
_MANIFEST_MAX_BYTES = 1 << 20  # a manifest is a few hundred bytes


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

def _is_slot_file(path: Path) -> bool:
    """A regular file that starts with llama.cpp's sequence-state magic."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(SLOT_FILE_MAGIC)) == SLOT_FILE_MAGIC
    except OSError:
        return False
