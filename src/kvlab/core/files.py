"""Files only their owner may read, written whole: a reader never sees half a file.

Slot manifests, per-request files and engine logs shipped back from a node hold users' prompts
or their timings, so they are created 0600, written to a temporary file beside the target and
renamed over it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (temporary file, then rename) with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        Path(tmp).chmod(0o600)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
