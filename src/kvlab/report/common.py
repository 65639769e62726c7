"""What both labs' tables share: picking records from the notebook, formatting cells, and
the "measured on" column (engine, version, model, context, memory fraction or the KV cache
size fixed in bytes, KV capacity, from the same run's `startup` line). The newest line of each
label wins; a figure that was not recorded is said in words, never "None"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from kvlab.core.sizes import human_bytes
from kvlab.engines.base import NAMES as ENGINE_NAMES
from kvlab.engines.base import LaunchSettings
from kvlab.engines.registry import known_engine
from kvlab.measure import compare
from kvlab.records.base import Number
from kvlab.records.evidence import LOOPBACK, Where
from kvlab.records.models import (
    CapacityRecord,
    ComparisonRecord,
    DiskRecord,
    LoadRecord,
    NotRunRecord,
    PredictionRecord,
    ProofRecord,
    Record,
    ReuseRecord,
    StartupRecord,
)
from kvlab.records.notebook import Notebook

R = TypeVar("R", bound=Record)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        rule = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |"
                for row in self.rows]
        return "\n".join([f"### {self.title}", "", head, rule, *body])


def latest(book: Notebook, kind: type[R], label: str) -> R | None:
    """The newest line of one kind and label."""
    found = book.of(kind, label)
    return found[-1] if found else None


def load_rows(book: Notebook, label: str) -> list[LoadRecord]:
    """The newest load row per concurrency level of one label, by concurrency."""
    rows = compare.load_rows(book.records, label)
    return [rows[c] for c in sorted(rows)]


def not_run(book: Notebook, label: str) -> NotRunRecord | None:
    return latest(book, NotRunRecord, label)


def num(value: Number | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value and abs(value) < 10 ** -digits * 10:  # keep small figures readable
            return f"{value:.3g}"
        return f"{value:.{digits}f}"
    return str(value)


def pct(value: Number | None) -> str:
    return "n/a" if value is None else f"{float(value) * 100:.1f}%"


def _own(record: Record) -> tuple[str | None, str | None, str | None]:
    """The model, engine and engine version a line states of itself (None: it does not)."""
    if isinstance(record, LoadRecord | ReuseRecord | DiskRecord | StartupRecord):
        return record.model, record.engine, record.engine_version
    if isinstance(record, CapacityRecord):
        return record.model, None, record.engine_version
    if isinstance(record, ProofRecord | ComparisonRecord | PredictionRecord):
        return record.model, None, None
    return None, None, None


def measured_on(book: Notebook, record: Record) -> str:
    """Engine, version, model, context and memory fraction from the run's startup line."""
    run_id, label = record.run_id, record.label
    same_run = [r for r in book.of(StartupRecord) if run_id is None or r.run_id == run_id]
    loopback = isinstance(record, Where) and record.topology == LOOPBACK
    starts = [r for r in same_run if r.label == label] or \
        [r for r in same_run if r.label.startswith(label + "-") and r.engine in ENGINE_NAMES] or \
        [r for r in same_run if run_id is not None and r.label.endswith("-decode")
         and loopback]  # a split whose engines carry older names
    parts = []
    model, engine, version = _own(record)
    fixed = fixed_kv_bytes(record)
    if starts:
        s = starts[-1]
        model = s.model or model
        ctx, fraction = _sizing(s)
        parts.append(f"{s.engine} {s.engine_version}")
        parts.append(f"ctx {ctx}" if ctx is not None else "context length not recorded")
        if fixed is not None:  # the cache was sized in bytes: the fraction did not size it
            parts.append(f"KV cache fixed at {human_bytes(fixed)} ({fixed:,} bytes)")
        elif fraction is not None:
            parts.append(f"mem fraction {fraction:g}")
        if s.capacity.kv_cache_tokens:
            parts.append(f"KV cache {s.capacity.kv_cache_tokens:,} tokens")
    else:
        said_engine = f"{engine or ''} {version or ''}".strip()
        parts += [said_engine] if said_engine else []
        parts.append("no startup line for this run (context and KV cache size not recorded)")
        if fixed is not None:
            parts.append(f"KV cache fixed at {human_bytes(fixed)} ({fixed:,} bytes)")
    if model:
        parts.append(f"model {'/'.join(model.rstrip('/').split('/')[-2:])}")
    return ", ".join(parts)


def fixed_kv_bytes(record: Record) -> int | None:
    """The KV cache size in bytes when the run fixed it (kvlab's pressure plan sizes the device
    cache in bytes), else None."""
    pressure = record.pressure if isinstance(
        record, LoadRecord | CapacityRecord | ReuseRecord) else None
    planned = pressure.planned if pressure is not None else None
    value = planned.kv_cache_bytes if planned is not None else None
    return int(value) if value else None


def said(value: Number | None, missing_words: str, digits: int = 3) -> str:
    """A figure, or what is missing in words (a cell never reads "None" or "n/a" alone)."""
    return missing_words if value is None else num(value, digits)


def _sizing(start: StartupRecord) -> tuple[int | None, float | None]:
    """Context and memory fraction as recorded; read from the argv for older notebooks."""
    if start.context_tokens is not None:
        return start.context_tokens, start.memory_fraction
    engine = known_engine(start.engine)
    sized = engine.launch_settings(start.argv) if engine is not None else LaunchSettings()
    return sized.context_tokens, sized.memory_fraction


def missing(row_name: str, how: str, book: Notebook, label: str, width: int) -> list[str]:
    """A row that has no measurement: the recorded reason it cannot run here, or how to get it."""
    skipped = not_run(book, label)
    if skipped:
        first, rest = f"not run here: {skipped.reason}", "not run here (see the reason)"
    else:
        first = f"not measured yet: no `{label}` line in the notebook (kvlab run all)"
        rest = "not measured yet"
    return [row_name, how, first, *([rest] * (width - 1))]
