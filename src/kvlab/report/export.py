"""`kvlab report --csv DIR`: the report's tables and the per-request data, as CSV files.

Written with the csv module, one file per table: each table of the report (its title made a
file name, its columns the header), the decisions (lab, question, answer, decided), and the
ratios with their 95% intervals (`intervals.csv`: every pair the plots draw, and each split
run against the baseline; `confidence` says the level, a `--repeat auto` run's its rule's).
Then one file per run with per-request data,
`requests-LABEL-cLEVEL[-rREPEAT].csv`: `label`, `level` and `repeat` columns, then every field
of the request lines, warm-up and failed requests included (their `warmup` and `status` say
so), inter-token gaps flattened to `itl_n`, `itl_p50_s`, `itl_p99_s`, `itl_max_s` and kvlab's
proxy's timeline to `timeline_prefill_s`, `timeline_handover_s` and so on; like the
per-request files they come from, these are created 0600. A file whose sha256 differs from its
row's is refused. Nothing is computed here that the report does
not show; the newest run of a label, level and repeat wins, as in the tables.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvlab.measure import intervals, paired_rows
from kvlab.records import BASELINE, LoadRecord, Notebook, requests
from kvlab.report.common import Table
from kvlab.report.decisions_common import Decision
from kvlab.report.placement import split_groups
from kvlab.report.plots import LOAD_PAIRS

INTERVAL_COLUMNS = ["label_a", "label_b", "concurrency", "metric", "ratio", "low", "high",
                    "words", "requests_a", "requests_b", "repeats_a", "repeats_b", "confidence"]
ITL_COLUMNS = {"n": "itl_n", "p50": "itl_p50_s", "p99": "itl_p99_s", "max": "itl_max_s"}
TIMELINE_COLUMNS = {k: f"timeline_{k}" for k in requests.ProxyTimeline.model_fields}
Cell = str | int | float | bool | None  # one CSV cell: None is written empty


def _request_columns() -> list[str]:
    out = ["label", "level", "repeat"]
    for name in requests.RequestLine.model_fields:
        if name == "itl_s":
            out += ITL_COLUMNS.values()
        elif name == "timeline":
            out += TIMELINE_COLUMNS.values()
        elif name not in ("level", "repeat"):
            out.append(name)
    return out


REQUEST_COLUMNS = _request_columns()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "table"


def write_all(tables: Sequence[Table], decisions: Sequence[Decision], book: Notebook,
              out: Path) -> list[Path]:
    """Every table, the decisions, the intervals and each run's requests under `out`; the
    files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [_write(out / f"{slug(t.title)}.csv", t.flat_header(), t.rows) for t in tables]
    written.append(_write(out / "decisions.csv", ["lab", "question", "answer", "decided"],
                          [[d.lab, d.question, d.answer, d.decided] for d in decisions]))
    written.append(_write(out / "intervals.csv", INTERVAL_COLUMNS, interval_rows(book)))
    return written + request_files(book, out)


def _write(path: Path, header: Sequence[str], rows: Iterable[Sequence[Cell]],
           private: bool = False) -> Path:
    """One CSV file; `private` ones (a user's requests) are created 0600, like their source."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(["" if cell is None else cell for cell in row] for row in rows)
    return path


def _pairs(book: Notebook) -> list[tuple[str, str]]:
    """(A, B) label pairs: A / B as the plots and the P/D table show them."""
    splits = [(g.label, BASELINE.label) for g in split_groups(book)]
    return list(dict.fromkeys([(other, base) for base, other in LOAD_PAIRS] + splits))


def interval_rows(book: Notebook) -> list[list[Cell]]:
    out: list[list[Cell]] = []
    for a_label, b_label in _pairs(book):
        a, b = paired_rows(book.records, a_label, b_label)
        for level, found in intervals.pair_levels(book.path, book.records, a, b).items():
            for key, iv in found.items():
                row = iv.as_record()
                out.append([a_label, b_label, level, key, row.ratio, row.low, row.high,
                            iv.words, *(iv.requests or (None, None)),
                            *(iv.repeats or (None, None)),
                            iv.confidence if iv.measured else None])
    return out


def request_files(book: Notebook, out: Path) -> list[Path]:
    """One CSV per run (label, level, repeat) whose row names a per-request file."""
    newest: dict[tuple[str, int, int | None], LoadRecord] = {}
    for row in book.of(LoadRecord):
        if row.requests_file is not None:
            newest[(row.label, row.concurrency, row.repeat)] = row
    written = []
    for (label, level, repeat), row in sorted(newest.items(), key=lambda kv: str(kv[0])):
        lines = requests.of_row(book.path, row.requests_file, row.requests_sha256)
        if lines is None:
            continue  # absent beside this notebook: the report says so
        name = f"requests-{slug(label)}-c{level}" + (f"-r{repeat}" if repeat is not None else "")
        written.append(_write(out / f"{name}.csv", REQUEST_COLUMNS,
                              (_request_row(label, level, repeat, line) for line in lines),
                              private=True))
    return written


def _request_row(label: str, level: int, repeat: int | None,
                 line: requests.RequestLine) -> list[Cell]:
    """One request's cells, in `REQUEST_COLUMNS`' order (its inter-token gaps flattened)."""
    data: dict[str, Cell] = {}
    for name, value in line:  # the line's fields, by name (a line's own extras after them)
        if name not in ("itl_s", "timeline"):
            data[name] = _cell(value)
    gaps = line.itl_s
    data.update({"itl_n": gaps.n if gaps else None, "itl_p50_s": gaps.p50 if gaps else None,
                 "itl_p99_s": gaps.p99 if gaps else None,
                 "itl_max_s": gaps.max if gaps else None})
    timeline = line.timeline
    data.update({column: getattr(timeline, k) if timeline else None
                 for k, column in TIMELINE_COLUMNS.items()})
    data.update(label=label, level=level,
                repeat=line.repeat if line.repeat is not None else repeat)
    return [data.get(column) for column in REQUEST_COLUMNS]


def _cell(value: object) -> Cell:
    """A request field as a CSV cell: a figure or words as it is, anything else as text."""
    return value if value is None or isinstance(value, str | int | float | bool) \
        else str(value)
