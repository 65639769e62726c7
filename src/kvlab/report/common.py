"""What both labs' tables share: picking records from the notebook, formatting cells, and
the "measured on" column (engine, version, model, context, memory fraction or the KV cache
size fixed in bytes, KV capacity, from the same run's `startup` line). The newest line of each
label wins; a figure that was not recorded is said in words, never "None"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kvlab.core import connectors, human_bytes
from kvlab.engines import NAMES as ENGINE_NAMES
from kvlab.engines import LaunchSettings, cache_server_title, failure_meaning, known_engine
from kvlab.measure import intervals, shortfall
from kvlab.records import (
    LOOPBACK,
    CapacityRecord,
    ComparisonRecord,
    DiskRecord,
    LoadRecord,
    Notebook,
    NotRunRecord,
    Number,
    OracleLevel,
    PredictionRecord,
    ProofRecord,
    Record,
    ReuseRecord,
    Row,
    StartupRecord,
    TtftAccount,
    Where,
    row_of,
)

R = TypeVar("R", bound=Record)


NO_FIGURE = "—"  # a figure cell of a row that did not run: its reason is said once


@dataclass
class Line:
    """One row of a report table: short figure cells (a figure, its interval, a word), a
    verdict, and the evidence behind them, which the pages show one click away."""

    name: str
    how: str
    cells: list[str]  # one per figure column
    evidence: list[str] = field(default_factory=list)
    measured_on: str = ""
    verdict: str = ""
    command: str = ""  # the kvlab command that measures the row
    absent: bool = False  # not run or not measured: `cells[0]` says why, once
    anchor: str = ""  # the row's id in the pages (decisions link to it)

    def flat(self) -> list[str]:
        """Every part of the row as one list (`Table.flat_header`'s columns)."""
        return [self.name, self.how, *self.cells, self.verdict or NO_FIGURE,
                "; ".join(self.evidence) or NO_FIGURE, self.measured_on or NO_FIGURE,
                self.command or NO_FIGURE]


@dataclass
class Table:
    title: str
    head: str  # what the first column names (a tier, a configuration, a step)
    columns: list[str]  # the figure columns
    lines: list[Line] = field(default_factory=list)

    @property
    def header(self) -> list[str]:
        return [self.head, "How it was measured", *self.columns, "Verdict"]

    @property
    def rows(self) -> list[list[str]]:
        """Each line flattened (`Line.flat`): what the CSV export writes."""
        return [line.flat() for line in self.lines]

    def flat_header(self) -> list[str]:
        return [*self.header, "Evidence", "Measured on", "Command"]

    def markdown(self) -> str:
        """The table with short cells, each row's details as a numbered note under it."""
        head = "| " + " | ".join([*self.header, "Details"]) + " |"
        rule = "|" + "|".join("---" for _ in range(len(self.header) + 1)) + "|"
        body, notes = [], []
        for n, line in enumerate(self.lines, 1):
            cells = [line.name, line.how, *line.cells, line.verdict or NO_FIGURE, f"[{n}]"]
            body.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
            notes.append(f"{n}. **{line.name}**: " + details_text(line))
        return "\n".join([f"### {self.title}", "", head, rule, *body, "", *notes])


def details_text(line: Line) -> str:
    """A row's evidence, what it was measured on and the command that measures it, in one
    paragraph."""
    parts = [*line.evidence]
    if line.measured_on:
        parts.append(f"measured on {line.measured_on}")
    if line.command:
        parts.append(f"to measure it: `{line.command}`")
    return "; ".join(parts) or "no evidence recorded"


def _md_cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def sequential_words(records: Sequence[Record], row: LoadRecord, other: str) -> str | None:
    """How a sequential run (`--repeat auto`) of `row`'s label against `other` chose its
    repeats, and the level its intervals are read at: `98.75% interval, sequential:
    stopped because ...; the rule: ...` (None: a run of a fixed count). The stop is on the
    one row of the run it was decided on, whichever side and level that was."""
    if row.repeat_confidence is None:
        return None
    stop = next((r.repeat_stop for r in reversed(records) if isinstance(r, LoadRecord)
                 and r.run_id == row.run_id and r.label in (row.label, other)
                 and r.repeat_stop), None)
    why = f"stopped because {stop}" if stop else "no stop recorded (the run ended first)"
    rule = (row.repeat_rule or "").removeprefix("sequential: ")
    return (f"{intervals.level_words(row.repeat_confidence)} interval, sequential: {why}"
            + (f"; the rule: {rule}" if rule else ""))


def latest(book: Notebook, kind: type[R], label: str) -> R | None:
    """The newest line of one kind and label."""
    found = book.of(kind, label)
    return found[-1] if found else None


def load_rows(book: Notebook, label: str) -> list[LoadRecord]:
    """The newest load row per concurrency level of one label, by concurrency: a level whose
    every request failed is kept, so a newer failed run shows over an older good one (the
    comparisons, `measure/pairing.py`, take measured levels only)."""
    rows = {r.concurrency: r for r in book.records
            if isinstance(r, LoadRecord) and r.label == label}
    return [rows[c] for c in sorted(rows)]


def all_failed(row: LoadRecord) -> bool:
    """A level that sent requests and got no answer it could measure."""
    return not row.ok and bool(row.failed)


def failed_words(row: LoadRecord) -> str:
    """A level whose every request failed, in words, e.g. "8 of 8 requests HTTP 400: the
    prompt exceeds the context" (the engine's own message where kvlab does not know it)."""
    kind = max(row.errors.items(), key=lambda kv: kv[1])[0] if row.errors else "failed"
    shown = kind.upper() if kind.startswith("http ") else kind
    detail = row.failures[0].detail if row.failures else ""
    why = failure_meaning(detail) or brief(detail.strip(), 80) or "no detail recorded"
    return f"{row.failed} of {row.requests or row.failed} requests {shown}: {why}"


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


def startup_of(book: Notebook, record: Record) -> StartupRecord | None:
    """The startup line of the engine a record measured: its run's, of its label (or of a
    split's engines)."""
    run_id, label = record.run_id, record.label
    same_run = [r for r in book.of(StartupRecord) if run_id is None or r.run_id == run_id]
    loopback = isinstance(record, Where) and record.topology == LOOPBACK
    row = row_of(label)
    starts = [r for r in same_run if r.label == label] or \
        [r for r in same_run if r.label.startswith(label + "-") and r.engine in ENGINE_NAMES] or \
        [r for r in same_run if row is not None and r.label in row.startup] or \
        [r for r in same_run if run_id is not None and r.label.endswith("-decode")
         and loopback]  # a split whose engines carry older names
    return starts[-1] if starts else None


def backend_called(backend: str) -> str:
    """A host-tier backend (KV_OFFLOAD_BACKEND) in a reader's words."""
    return connectors.BACKEND_TITLES.get(backend, backend)


def tier_held_by(tier: str | None) -> str | None:
    """Who holds a tier-on row's host tier, where it is not vLLM itself (LMCache's server),
    from the row's tier words; None for vLLM's own tier, or no tier."""
    return connectors.backend_title(tier) if connectors.tier_by_server(tier) else None


def tier_title(title: str, tier: str | None) -> str:
    """A tier row's title, naming the tier's holder where it is not vLLM's own."""
    held = tier_held_by(tier)
    return f"{title} (tier in {held})" if held else title


def companions_of(book: Notebook, start: StartupRecord, label: str = "") -> list[StartupRecord]:
    """The cache servers started before `start`'s engine, or before another engine of row
    `label`, for them (their run's startup lines `<engine's label>-<their role>`, e.g. the one
    LMCache server both instances of the shared store reach)."""
    def of(engines: set[str]) -> list[StartupRecord]:
        return [r for r in book.of(StartupRecord) if r.run_id == start.run_id
                and is_companion(r) and any(r.label == f"{e}-{r.role}" for e in engines)]

    row = row_of(label)  # its own first; else its row's other engines' (a pair's one server)
    return of({start.label}) or of(set(row.startup) if row is not None else set())


def is_companion(start: StartupRecord) -> bool:
    """Whether a startup line is a cache server's started beside an engine (LMCache's)."""
    return cache_server_title(start.engine) is not None


def companion_words(start: StartupRecord) -> str:
    """A cache server's startup line in a reader's words: what it is, its version and the
    KV it holds in memory (LMCache's L1, from its /status)."""
    title = cache_server_title(start.engine) or start.engine
    version = start.engine_version
    held = start.capacity.kv_cache_bytes
    return (f"{title} " + (version if version and version != "unknown"
                           else "of a version not recorded")
            + (f", L1 {held / 2**30:g} GiB" if held else ", L1 not recorded"))


def kv_bytes_per_token(start: StartupRecord | None) -> tuple[float, str] | None:
    """KV bytes a token takes, as the engine's startup sized its cache (bytes over tokens),
    and where that came from; None where its line states no both."""
    cap = start.capacity if start is not None else None
    if start is None or cap is None or not cap.kv_cache_tokens:
        return None
    gib = cap.cpu_kv_gib or cap.available_kv_gib
    size = cap.kv_cache_bytes or (gib * 2**30 if gib else None)
    given = _flag_bytes(start.argv, "--kv-cache-memory-bytes")  # a cache it was given
    if not size and given:
        return (given / cap.kv_cache_tokens, f"{start.engine}'s startup: the "
                f"--kv-cache-memory-bytes {given:,} it ran with, for its {cap.kv_cache_tokens:,} "
                "tokens")
    if not size:
        return None
    return (size / cap.kv_cache_tokens, f"{start.engine}'s startup: {size / 2**30:g} GiB for "
            f"{cap.kv_cache_tokens:,} tokens")


def _flag_bytes(argv: list[str], flag: str) -> int | None:
    """A whole number of bytes `flag` was given in `argv` (None if absent or not a number)."""
    if flag not in argv[:-1]:
        return None
    value = argv[argv.index(flag) + 1]
    return int(value) if value.isdigit() else None


def measured_on(book: Notebook, record: Record) -> str:
    """Engine, version, model, context and memory fraction from the run's startup line."""
    parts = []
    model, engine, version = _own(record)
    fixed = fixed_kv_bytes(record)
    if (s := startup_of(book, record)) is not None:
        model = s.model or model
        ctx, fraction = _sizing(s)
        parts.append(f"{s.engine} {s.engine_version}"
                     + (" (not the build kvlab pins: see the startup line)" if s.version_note
                        else ""))
        parts[-1] += "".join(f" (with its {companion_words(c)})"
                             for c in companions_of(book, s, record.label))
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


def oracle_cell(row: LoadRecord, measured: str) -> str:
    """A hit-rate cell with the oracle beside it, where the level has one: the share of the
    measured requests' prompt tokens they reported cached against the oracle's, one basis
    (the counters' hit rate before it also counts the warm-up and the tier apart)."""
    o = row.oracle
    if o is None or o.predicted_share is None or o.measured_share is None:
        return measured
    which = ("oracle" if o.slots is None else "slot and RAM cache oracle"
             if o.ram_cache_bytes is not None else "slot oracle")
    return f"{measured}; requests {o.measured_share:.1%}, {which} {o.predicted_share:.1%}"


def oracle_words(row: LoadRecord) -> list[str]:
    """The cache oracle's evidence for a load row: predicted against measured, what is left
    on the table with its interval, and the shortfall verdict where there is one; then where
    its TTFT went by the engine's own accounts."""
    o = row.oracle
    account = [ttft_account_words(row.ttft_account)] if row.ttft_account else []
    if o is None:
        return account
    band = (f" (mean per request {o.left_mean_low:.1%} to {o.left_mean_high:.1%})"
            if o.left_mean_low is not None and o.left_mean_high is not None else "")
    held = (f"{o.slots} slots of one prompt each" + _ram_held(o) if o.slots is not None
            else f"{o.block_tokens}-token blocks, {o.device_blocks:,} on the device")
    words = [f"cache oracle ({held}"
             + (f", {o.tier_blocks:,} in the tier" if o.tier_blocks else "")
             + f", from {o.sizes_from}): {o.predicted_cached_tokens:,} of "
             f"{o.prompt_tokens:,} prompt tokens cacheable, {o.measured_cached_tokens:,} "
             f"reported cached; left on the table {pct(o.left_share)}{band}; a cache that "
             f"never evicts: {o.infinite_cache_tokens:,}; {o.above_oracle} requests above it"]
    verdict = shortfall(o)
    return [*words, *([verdict] if verdict else []), *account]


def ttft_account_words(a: TtftAccount) -> str:
    """Where a level's TTFT went, by the engine's accounts, with their source."""
    parts = [f"{name} {value:.3f} s" for name, value in (
        ("waiting to be scheduled", a.queue), ("computing the prompt", a.prefill),
        ("outside the engine", a.outside)) if value is not None]
    return (f"TTFT {a.client_ttft:.3f} s (mean of {a.requests} by the engine): "
            + ", ".join(parts) + f" (from {a.source})"
            + (f"; {a.not_reported}" if a.not_reported else ""))


def _ram_held(o: OracleLevel) -> str:
    """The RAM cache under a slot oracle's slots, in its words."""
    if o.ram_cache_bytes is None:
        return f"; {o.ram_cache_note}" if o.ram_cache_note else ""
    size = f"{o.ram_cache_bytes / 2**20:,.0f} MiB" if o.ram_cache_bytes else "no byte limit"
    return f", a RAM prompt cache of {size} under them"


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


def missing(row: Row, book: Notebook, width: int, label: str | None = None,
            name: str | None = None, how: str | None = None) -> Line:
    """A row that has no measurement: the recorded reason it cannot run here, or how to get
    it, said once (the other figure cells are empty)."""
    label = label or row.label
    skipped = not_run(book, label)
    if skipped:
        first, verdict = f"not run here: {skipped.reason}", "not run"
    else:
        first = f"not measured yet: no `{label}` line in the notebook"
        verdict = "not measured"
    short = brief(first)
    return Line(name or row.title, row.how if how is None else how,
                [short, *([NO_FIGURE] * (width - 1))], [first] if short != first else [],
                verdict=verdict, command=row.command, absent=True, anchor=label)


CELL_LIMIT = 120  # characters of visible text in a table cell


def brief(text: str, limit: int = CELL_LIMIT) -> str:
    """`text` cut to its first sentence, then to `limit` characters at a word (before a
    `code` span it would cut), for a table cell (the whole text goes to the row's details)."""
    if len(text) <= limit:
        return text
    first = text.split(". ")[0].split("; ")[0]
    if len(first) <= limit:
        return _whole_code(first) + " (…)"
    return _whole_code(first[: limit - 2].rsplit(" ", 1)[0]) + " …"


def _whole_code(cut: str) -> str:
    """A cut text without a `code` span the cut left open (it would show as a backtick)."""
    return cut[: cut.rindex("`")].rstrip() if cut.count("`") % 2 else cut


# a crossing's verdict (`measure.crossing`) in a reader's words, after "the split" or "the
# host tier"
CROSSING_WORDS = {"pays-above": "pays above a length", "pays-below": "pays below a length",
                  "pays-everywhere": "pays at every length measured",
                  "pays-nowhere": "pays at no length measured",
                  "mixed": "has no single boundary", "not-enough-evidence": "is not decided"}


def crossing_words(verdict: str) -> str:
    """A crossing's verdict in a reader's words (an unknown one as it is)."""
    return CROSSING_WORDS.get(verdict, verdict)
