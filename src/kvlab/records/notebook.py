"""The lab notebook: JSON lines appended to LABBOOK, readable by the seed scripts.

Writing: each record is one `json.dumps` line written with a single `os.write` on an
O_APPEND descriptor while holding an exclusive `flock`, so concurrent writers (processes or
threads) never interleave or lose a line, and a record that cannot be serialised is refused
before anything touches the file. Every record carries the envelope `lab`, `record`, `label`,
`recorded_at`, `kvlab_version` and `schema`; the rest keeps the seed's shapes.

Reading: every line becomes its typed record (`records.models.parse`); prose lines are skipped;
a line that starts like JSON but does not parse, or parses as no record kvlab reads, is counted
and its reason kept (`Notebook.unreadable`), never fatal and never half-read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kvlab.core import InputError, is_secret_name, secret_in_list, secret_in_text
from kvlab.records.base import LAB_OFFLOAD, LAB_PD, Record, now_stamp
from kvlab.records.models import parse

__all__ = ["LAB_OFFLOAD", "LAB_PD", "Notebook", "append", "encode", "now_stamp", "read"]


def check_no_secrets(record: Mapping[str, object], path: str = "") -> None:
    """Refuse a record that carries a secret: a key that names one (`api_key`, `Api-Key`,
    `hf-token`, `credentials`, `passwd`), or a value that holds one (`["--api-key", "sk-.."]`,
    a shell line with `--api-key=...`, a string shaped like a key). Plans and logs redact at
    the source (`core/secrets.py`); this is the last line of defence, so it refuses."""
    for key, value in record.items():
        where = f"{path}.{key}" if path else str(key)
        if is_secret_name(str(key)):
            raise ValueError(f"refusing to write a secret-looking field {where!r} to the notebook")
        _check_value(value, where)


def _check_value(value: object, where: str) -> None:
    found = None
    if isinstance(value, Mapping):
        check_no_secrets(value, where)
    elif isinstance(value, str):
        found = secret_in_text(value)
    elif isinstance(value, list | tuple):
        found = secret_in_list(value)
        for i, item in enumerate(value):
            if found is None:
                _check_value(item, f"{where}[{i}]")
    if found is not None:
        raise ValueError(f"refusing to write {where!r} to the notebook: it holds {found} "
                         "(a secret)")


def _clean(value: object) -> object:
    """JSON has no NaN or infinity: write them as null so every reader can parse the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def encode(record: Record) -> bytes:
    """One typed record as one newline-terminated line, validated before any write."""
    line = record.line()
    for key in ("lab", "record", "label"):
        if not line.get(key):
            raise ValueError(f"notebook record lacks {key!r}")
    check_no_secrets(line)
    text = json.dumps(_clean(line), sort_keys=True, allow_nan=False, default=str)
    return (text + "\n").encode("utf-8")


def append(path: Path | str, record: Record) -> None:
    """Append one record to the notebook atomically with respect to other writers."""
    data = encode(record)
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise InputError(f"LABBOOK {target}: cannot be opened for appending ({exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


R = TypeVar("R", bound=Record)


@dataclass
class Notebook:
    """The notebook's records, typed, in file order, with what was skipped."""

    path: Path
    records: list[Record] = field(default_factory=list)
    prose_lines: int = 0
    foreign_lines: int = 0  # JSON objects that are no record kvlab or the seeds write
    broken: list[tuple[int, str]] = field(default_factory=list)  # (line number, why skipped)

    @property
    def broken_lines(self) -> int:
        return len(self.broken)

    @property
    def unreadable(self) -> list[str]:
        """Why each kvlab-shaped line that failed its record's model failed."""
        return [why for _, why in self.broken if not why.startswith(NOT_JSON)]

    def by_record(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.record == kind]

    def by_label(self, label: str) -> list[Record]:
        return [r for r in self.records if r.label == label]

    def of(self, kind: type[R], label: str | None = None) -> list[R]:
        """The records of one kind (optionally one label), as that kind's model."""
        return [r for r in self.records
                if isinstance(r, kind) and (label is None or r.label == label)]

    def labels(self) -> list[str]:
        return sorted({r.label for r in self.records if r.label})


def read(path: Path | str) -> Notebook:
    """Every JSON object in the notebook; prose and broken lines are counted, not fatal."""
    book = Notebook(Path(path))
    try:
        text = book.path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError(f"LABBOOK {book.path}: no such file; run a measurement first") from None
    except OSError as exc:
        raise InputError(f"LABBOOK {book.path}: cannot be read ({exc})") from None
    for number, raw in _lines(text):
        if not raw.startswith("{"):
            book.prose_lines += 1 if raw else 0
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            book.broken.append((number, f"{NOT_JSON} ({exc.msg}, column {exc.colno})"))
            continue
        if not isinstance(obj, dict):
            book.broken.append((number, f"{NOT_JSON} object"))
            continue
        record = parse(obj)
        if isinstance(record, Record):
            book.records.append(record)
        elif record.foreign:
            book.foreign_lines += 1
        else:
            book.broken.append((number, record.why))
    return book


NOT_JSON = "not a JSON"


def _lines(text: str) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(text.splitlines(), 1):
        yield number, raw.strip()
