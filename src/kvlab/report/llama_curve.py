"""llama.cpp's RAM cache against its size (`kvlab run llama-tiers --part curve`): one run per
size of the same user sessions, the no-cache size the reference, and the offload lab's
question answered: the smallest `--cache-ram` that reaches 90% of the best measured gain.

A gain is the fall in TTFT p50 against no RAM cache (1 - the ratio), counted only where the
ratio's interval lies wholly below 1; "no size paid" when none does. The cliff is the step
between two measured sizes where the returning turns recomputed fell the most.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from kvlab.measure import intervals
from kvlab.records.models import LoadRecord
from kvlab.records.notebook import Notebook
from kvlab.records.rows import LLAMA_RAM_CURVE

MIB = 2**20
SHARE_OF_BEST = 0.9  # the lab's "raise it only if the measurement rewards you", as a rule


@dataclass(frozen=True)
class CurvePoint:
    """One size's run: its RAM cache, TTFT p50 against none, the turns it recomputed."""

    row: LoadRecord
    mib: int
    ttft: intervals.Interval | None  # None for the reference (no RAM cache)

    @property
    def recomputed(self) -> int | None:
        return self.row.sessions.evicted_turns if self.row.sessions else None

    @property
    def gain(self) -> float:
        """The fall in TTFT p50 against none, where the interval shows one; else 0."""
        iv = self.ttft
        if iv is None or iv.ratio is None or iv.high is None or iv.high >= 1:
            return 0.0
        return 1 - iv.ratio


def _mib(row: LoadRecord) -> int:
    planned = row.pressure.planned if row.pressure is not None else None
    tier = planned.host_tier_bytes if planned is not None else None
    return round((tier or 0) / MIB)


def points(book: Notebook) -> list[CurvePoint]:
    """The newest curve run's sizes, smallest first, each against its no-cache size (empty:
    no curve run, or none without a RAM cache to compare with)."""
    rows = [r for r in book.records if isinstance(r, LoadRecord)
            and r.label == LLAMA_RAM_CURVE.label]
    if not rows:
        return []
    run = [r for r in rows if r.run_id == rows[-1].run_id]
    newest = {_mib(r): r for r in run}
    if 0 not in newest:
        return []
    off = newest[0]
    return [CurvePoint(r, mib, None if mib == 0 else
                       intervals.ttft(book.path, book.records, r, off))
            for mib, r in sorted(newest.items())]


def best_point(found: list[CurvePoint]) -> CurvePoint | None:
    """The measured size with the largest gain (the first, on a tie; None: no sized run)."""
    return max((p for p in found if p.mib), key=lambda p: p.gain, default=None)


def answer(found: list[CurvePoint]) -> str:
    """The lab's question in one sentence, from the measured sizes."""
    sized = [p for p in found if p.mib]
    best = best_point(found)
    if best is None or best.gain <= 0:
        shown = "; ".join(f"{p.mib} MiB {p.ttft.cell()}" for p in sized if p.ttft)
        return f"no size paid: no RAM cache size brought TTFT p50 below none ({shown})"
    enough = next(p for p in sized if p.gain >= SHARE_OF_BEST * best.gain)
    assert enough.ttft is not None and best.ttft is not None
    said = (f"--cache-ram {enough.mib} MiB is the smallest size measured that reached 90% of "
            f"the best gain: TTFT p50 {enough.ttft.cell()} against none")
    if enough is best:
        return f"{said} (the best measured)"
    return f"{said} (the best, {best.mib} MiB: {best.ttft.cell()})"


def cliff(found: list[CurvePoint]) -> str | None:
    """Where the returning turns recomputed fell the most between two measured sizes."""
    steps = [(a.recomputed - b.recomputed, a, b) for a, b in itertools.pairwise(found)
             if a.recomputed is not None and b.recomputed is not None]
    if not steps:
        return None
    drop, a, b = max(steps, key=lambda s: s[0])
    if drop <= 0:
        return "no cliff: the returning turns recomputed did not fall with size"
    return (f"the cliff: from {a.mib} to {b.mib} MiB the returning turns recomputed fell "
            f"from {a.recomputed} to {b.recomputed}")

