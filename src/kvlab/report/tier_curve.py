"""A host tier against its size, from the notebook: llama.cpp's RAM cache (`kvlab run
llama-tiers --part curve`) and vLLM's host tier (`kvlab run offload --part curve`), each the
same user sessions at several sizes, the no-tier size the reference, and the offload lab's
question answered: the smallest size that reaches 90% of the best measured gain.

A size's runs (its repeats) are pooled; its gain is the fall in TTFT p50 against no tier
(1 - the ratio), counted only where the ratio's interval lies wholly below 1; "no size
paid" when none does. The cliff is the step between two measured sizes where the returning
turns recomputed (the mean over a size's repeats) fell the most. vLLM's curve also has the
returning turns' hit share per size, with a bootstrap interval over those turns, and the
oracle's line from the tier-off runs (`OracleLevel.tier_curve`: the same requests replayed
with tiers no engine ran).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvlab.measure import intervals
from kvlab.records import (
    LLAMA_RAM_CURVE,
    OFFLOAD_CURVE,
    LoadRecord,
    Notebook,
    NotRunRecord,
    Row,
    requests,
)

SHARE_OF_BEST = 0.9  # the lab's "raise it only if the measurement rewards you", as a rule


@dataclass(frozen=True)
class Knob:
    """How a curve's sizes are named: the setting, its unit, the tier's name."""

    row: Row
    setting: str
    unit: str
    scale: int  # bytes in one unit
    tier: str

    def size(self, value: float) -> str:
        return f"{value:g} {self.unit}"


RAM = Knob(LLAMA_RAM_CURVE, "--cache-ram", "MiB", 2**20, "RAM cache")
HOST = Knob(OFFLOAD_CURVE, "KV_OFFLOAD_GB", "GiB", 2**30, "host tier")


@dataclass(frozen=True)
class CurvePoint:
    """One size's runs: its tier, TTFT p50 against none, the turns it recomputed."""

    rows: tuple[LoadRecord, ...]
    size: float  # in the knob's unit; 0: the reference
    ttft: intervals.Interval | None  # None for the reference

    @property
    def row(self) -> LoadRecord:
        return self.rows[-1]

    @property
    def recomputed(self) -> float | None:
        """The returning turns recomputed, the mean over the size's runs."""
        found = [r.sessions.evicted_turns for r in self.rows if r.sessions]
        return sum(found) / len(found) if found else None

    @property
    def gain(self) -> float:
        """The fall in TTFT p50 against none, where the interval shows one; else 0."""
        iv = self.ttft
        if iv is None or iv.ratio is None or iv.high is None or iv.high >= 1:
            return 0.0
        return 1 - iv.ratio


def _bytes(row: LoadRecord) -> int:
    planned = row.pressure.planned if row.pressure is not None else None
    return (planned.host_tier_bytes if planned is not None else None) or 0


def newest_run(book: Notebook, label: str) -> list[LoadRecord]:
    """The rows of `label` from its newest run (one run_id)."""
    rows = [r for r in book.records if isinstance(r, LoadRecord) and r.label == label]
    return [r for r in rows if r.run_id == rows[-1].run_id] if rows else []


def points(book: Notebook, knob: Knob = RAM) -> list[CurvePoint]:
    """The newest curve run's sizes, smallest first, each (its repeats pooled) against the
    no-tier size (empty: no curve run, or none without a tier to compare with)."""
    by: dict[float, list[LoadRecord]] = {}
    for r in newest_run(book, knob.row.label):
        by.setdefault(round(_bytes(r) / knob.scale, 3), []).append(r)
    if 0 not in by:
        return []
    off = by[0]
    return [CurvePoint(tuple(rows), size, None if size == 0 else intervals.between_rows(
        book.path, rows, off, (intervals.BY_KEY["ttft_p50"],))["ttft_p50"])
        for size, rows in sorted(by.items())]


def not_run(book: Notebook, knob: Knob, found: Sequence[CurvePoint]) -> list[str]:
    """The reasons the newest curve run gave for the sizes it could not run."""
    run = found[0].row.run_id if found else None
    return [r.reason for r in book.records if isinstance(r, NotRunRecord)
            and r.label == knob.row.label and run is not None and r.run_id == run]


def best_point(found: list[CurvePoint]) -> CurvePoint | None:
    """The measured size with the largest gain (the first, on a tie; None: no sized run)."""
    return max((p for p in found if p.size), key=lambda p: p.gain, default=None)


def answer(found: list[CurvePoint], knob: Knob = RAM) -> str:
    """The lab's question in one sentence, from the measured sizes."""
    sized = [p for p in found if p.size]
    best = best_point(found)
    if best is None or best.gain <= 0:
        shown = "; ".join(f"{knob.size(p.size)} {p.ttft.cell()}" for p in sized if p.ttft)
        return (f"no size paid: no {knob.tier} size brought TTFT p50 below none"
                + (f" ({shown})" if shown else ""))
    enough = next(p for p in sized if p.gain >= SHARE_OF_BEST * best.gain)
    assert enough.ttft is not None and best.ttft is not None
    said = (f"{knob.setting} {knob.size(enough.size)} is the smallest size measured that "
            f"reached 90% of the best gain: TTFT p50 {enough.ttft.cell()} against none")
    if enough is best:
        return f"{said} (the best measured)"
    return f"{said} (the best, {knob.size(best.size)}: {best.ttft.cell()})"


def cliff(found: list[CurvePoint], knob: Knob = RAM) -> str | None:
    """Where the returning turns recomputed fell the most between two measured sizes."""
    steps = [(a.recomputed - b.recomputed, a, b) for a, b in itertools.pairwise(found)
             if a.recomputed is not None and b.recomputed is not None]
    if not steps:
        return None
    drop, a, b = max(steps, key=lambda s: s[0])
    if drop <= 0:
        return "no cliff: the returning turns recomputed did not fall with size"
    return (f"the cliff: from {a.size:g} to {knob.size(b.size)} the returning turns "
            f"recomputed fell from {a.recomputed:g} to {b.recomputed:g}")


# --- the returning turns' hit share, measured and as the oracle replays it -----------------
@dataclass(frozen=True)
class Share:
    """Prompt tokens cached over the returning turns, with its 95% interval over them."""

    share: float
    low: float | None
    high: float | None


def returning_share(path: Path, rows: Sequence[LoadRecord]) -> Share | None:
    """The returning turns' hit share over a size's runs (None: no per-request file or no
    returning turn): sum of cached over sum of prompt tokens, resampled by turn."""
    table: list[tuple[float, float]] = []
    for row in rows:
        lines = requests.of_row(path, row.requests_file, row.requests_sha256)
        if lines is None:
            return None
        for line in lines:
            if (line.status == "ok" and not line.warmup and line.turn and line.prompt_tokens
                    and line.cached_tokens is not None):
                table.append((float(line.cached_tokens), float(line.prompt_tokens)))
    if not table:
        return None
    data = np.asarray(table, dtype=np.float64)
    share = float(data[:, 0].sum() / data[:, 1].sum())
    if len(data) < intervals.MIN_SAMPLES:
        return Share(share, None, None)
    drawn = intervals.draws([data], np.random.default_rng(intervals.SEED), intervals.RESAMPLES)
    ratios = np.nansum(drawn[..., 0], axis=1) / np.nansum(drawn[..., 1], axis=1)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return Share(share, float(low), float(high))


def oracle_line(found: Sequence[CurvePoint], knob: Knob = HOST) -> list[tuple[float, float]]:
    """(size in the knob's unit, the returning turns' hit share) as the oracle replayed the
    newest tier-off run at each tier size (empty: no oracle beside it)."""
    off = next((p for p in found if not p.size), None)
    o = off.row.oracle if off is not None else None
    planned = off.row.pressure.planned if off is not None and off.row.pressure else None
    if o is None or planned is None:
        return []
    per_block = o.block_tokens * planned.bytes_per_token / knob.scale
    return [(p.tier_blocks * per_block, p.returning_hit_share) for p in o.tier_curve
            if p.returning_hit_share is not None]


def oracle_words(line: list[tuple[float, float]], knob: Knob = HOST) -> str | None:
    """The smallest replayed size that reaches 90% of the oracle's gain, in words."""
    if len(line) < 2:
        return None
    base, best = line[0][1], max(s for _, s in line)
    if best <= base:
        return "the oracle's line is flat: no returning turn would come back from a tier"
    size = next(x for x, s in line if s - base >= SHARE_OF_BEST * (best - base))
    return (f"the oracle (the tier-off runs replayed) reaches 90% of its gain in the "
            f"returning turns' hit share ({base:.1%} to {best:.1%}) at {knob.setting} "
            f"{size:.3g}")
