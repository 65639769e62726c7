"""Directories that will hold prompts, readable by this account only.

A plan's `private_dirs` (a slot store, a model cache) are made here before the engine starts:
created 0700, or, when they exist already, accepted only when no other account owns them and
not every user may write into them. kvlab never changes the mode of a directory it did not
create.

Deliberately not here: what goes into them (the engines' own modules) and starting the engine
(`process.py`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kvlab.core import RefusedError


def make_private_dir(path: Path) -> None:
    """Create `path` (and parents) readable by this account only, or accept an existing one
    that is safe as it is: it will hold prompts.

    kvlab never changes the mode of a directory it did not create (`LLAMA_SLOT_SAVE_PATH=/tmp`
    made 0700 would lock every other user out of /tmp). An existing directory, or the one a
    symlink given as the setting points to, is refused when every user may write into it or
    another account owns it. One it creates is opened without following symlinks before its
    mode is set, so a link planted in a shared parent cannot redirect the chmod.
    """
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
        created = True
    except FileExistsError:
        created = False
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if created else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise RefusedError(f"{path} cannot be used as a private directory "
                           f"({exc.strerror}); choose a directory of your own") from None
    try:
        if created:
            os.fchmod(fd, 0o700)  # the umask may have taken the owner's bits
        else:
            _check_safe_dir(path, os.fstat(fd))
    finally:
        os.close(fd)


def _check_safe_dir(path: Path, st: os.stat_result) -> None:
    """Refuse an existing directory others can write into or that another account owns."""
    if st.st_uid != os.geteuid():
        raise RefusedError(
            f"{path} belongs to another account (uid {st.st_uid}): kvlab keeps prompts only "
            "in a directory you own; choose a path of your own (kvlab creates it 0700)")
    if st.st_mode & stat.S_IWOTH:
        raise RefusedError(
            f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}): kvlab "
            "keeps prompts only in a directory of its own and never changes a directory it "
            "did not create; choose a new path (kvlab creates it 0700)")
