"""How long an experiment took when it last ran here, read from the notebook: the estimate
`kvlab run all --dry-run` gives beside each experiment's plans.

An experiment's lines are those its report rows are read by (their labels, their capacity
searches' and their engines' startup labels: `records/rows.py`); its last run is the newest
run id among them, and the time it took runs from its first engine's launch (the first
startup line's time less its start) to its last line. No earlier run, no estimate: a
measurement on this machine, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kvlab.core import InputError
from kvlab.records import Record, Row, StartupRecord, notebook


@dataclass(frozen=True)
class Took:
    """One earlier run of an experiment on this machine."""

    seconds: float
    run_id: str
    when: str  # its last line's time

    def words(self) -> str:
        minutes, seconds = divmod(round(self.seconds), 60)
        return f"about {minutes} min {seconds:02d} s (run {self.run_id}, ended {self.when})"


def _labels(rows: tuple[Row, ...]) -> set[str]:
    return {label for row in rows for label in (row.label, row.capacity, *row.startup)}


def _stamp(line: Record) -> float:
    return datetime.strptime(line.recorded_at, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def read_lines(labbook: Path | str) -> list[Record]:
    """The notebook's lines (none when there is no notebook yet, or it cannot be read)."""
    try:
        return notebook.read(labbook).records
    except InputError:
        return []


def took(labbook: Path | str, rows: tuple[Row, ...],
         records: list[Record] | None = None) -> Took | None:
    """The last run of the experiment that fills `rows` in the notebook, or in `records`
    already read from it (None: none, or no notebook yet)."""
    records = read_lines(labbook) if records is None else records
    labels = _labels(rows)
    mine = [r for r in records if r.run_id and r.label in labels]
    if not mine:
        return None
    last = max(mine, key=_stamp).run_id
    lines = [r for r in mine if r.run_id == last]
    starts = [_stamp(r) - (r.ready_s or 0.0) for r in lines if isinstance(r, StartupRecord)]
    end = max(_stamp(r) for r in lines)
    begin = min([*starts, *(_stamp(r) for r in lines)])
    return Took(end - begin, str(last), max(lines, key=_stamp).recorded_at)
