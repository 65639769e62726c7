"""A user-session run's requests by turn, from its per-request files: the first turn of a
conversation (which no cache can help) apart from the turns that come back to it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from kvlab.measure import intervals
from kvlab.records import LoadRecord, Notebook, requests


@dataclass(frozen=True)
class Turns:
    """TTFTs of the ok, non-warm-up requests of one run (all its repeats), by turn."""

    by_turn: dict[int, list[float]]

    @property
    def first(self) -> list[float]:
        return self.by_turn.get(0, [])

    @property
    def later(self) -> list[float]:
        return [t for turn, values in self.by_turn.items() if turn > 0 for t in values]


def turns(book: Notebook, row: LoadRecord) -> Turns | None:
    """`row`'s run by turn (None: not a session run, or a repeat names no per-request file)."""
    if row.workload is None or row.workload.kind != "sessions":
        return None
    rows = intervals.repeats(book.records, row)
    read = [requests.of_row(book.path, r.requests_file, r.requests_sha256) for r in rows]
    if any(lines is None for lines in read):
        return None
    found: dict[int, list[float]] = defaultdict(list)
    for lines in read:
        for line in lines or ():
            if line.status == "ok" and not line.warmup and line.ttft_s is not None \
                    and line.turn is not None:
                found[line.turn].append(line.ttft_s)
    return Turns(dict(sorted(found.items()))) if found else None


def p50(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _medians(draws: intervals.Floats) -> intervals.Floats:
    return np.asarray(np.nanmedian(draws, axis=1), dtype=np.float64)


def median_interval(values: list[float]) -> tuple[float, float] | None:
    """A 95% bootstrap interval for the median of `values` (None: fewer than 3)."""
    return intervals.one_sample(values, _medians, min_samples=3)
