"""Why an engine stopped, read from its own log: the one line a person should see first.

A dying vLLM logs its root cause inside a worker's traceback, then wrappers that point back
at it (`RuntimeError: Worker failed with error '...', please check the stack trace above`,
`EngineDeadError: ... See stack trace (above) for the root cause`), and its API server may
then exit 0. So the cause is the last exception line that does not point above itself, and a
full filesystem (ENOSPC, however the library spells it) is named as such. Warning and info
lines that quote an error (vLLM's ulimit advice names `OSError: [Errno 24]`) raised nothing
and are skipped.
"""

from __future__ import annotations

import re

FULL = re.compile(r"No space left on device|os error 28\b|\[Errno 28\]|StorageFull")
EXCEPTION = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b: ")
POINTS_ABOVE = re.compile(r"\babove\b", re.IGNORECASE)
_SHOWN = 300


def cause(log: str, *, kv_store: bool = False) -> str | None:
    """The log's cause of death in one line, None when it shows no exception.

    A full filesystem reads "the KV store's filesystem is full" when the engine writes a KV
    store (`kv_store`), else "a filesystem the engine writes to is full", followed by the
    log's own line.
    """
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    raised = [ln[m.start():] for ln in lines if (m := EXCEPTION.search(ln))
              and not _quoted(ln)]
    own = [ln for ln in raised if not POINTS_ABOVE.search(ln)] or raised
    full = [ln for ln in own if FULL.search(ln)]
    if full:
        what = "the KV store's filesystem is full" if kv_store else \
            "a filesystem the engine writes to is full"
        return f"{what} ({full[-1][:_SHOWN]})"
    return own[-1][:_SHOWN] if own else None


def _quoted(line: str) -> bool:
    """A warning or info line that merely mentions an error (vLLM's ulimit advice)."""
    return " WARNING " in line or " INFO " in line


def writes_kv_store(argv: list[str]) -> bool:
    """Whether an engine's command line gives it a shared KV directory (vLLM's
    `--kv-transfer-config` with a storage path)."""
    return any("shared_storage_path" in arg or "storage_path" in arg for arg in argv)
