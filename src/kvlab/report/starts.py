"""How much of the latest run went to starting engines, from its startup lines alone.

A run's span runs from its first notebook line, or the launch of an engine whose ready line
came first (a lab that opens with a start), to its last line; the time after the last line is
not in the notebook. A fresh start is the time from its launch to its ready line (its
`ready_s` before the line's stamp), and starts that overlap (engines started
together, one `start_batch`, or two batches of one experiment) count their union once; an engine
kept from an earlier step of a `kvlab run all` pass (`StartupRecord.reused`) counts the reset
and its check instead, and the start it saved is said beside.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kvlab.records import Notebook, StartupRecord
from kvlab.report.common import companion_words, is_companion


@dataclass(frozen=True)
class Starts:
    """The latest run's engine starts, against its span."""

    run_id: str
    span_s: float
    starts: int
    start_s: float
    together: int  # of `starts`, the engines started together with others
    batches: int  # the starts they shared
    kept: int
    reset_s: float
    saved_s: float
    servers: tuple[str, ...] = ()  # of `starts`, the cache servers started beside engines

    def sentence(self) -> str:
        kept = (f"; {self.kept} engine(s) kept from the previous step and reset instead "
                f"(checked in {_clock(self.reset_s)}, {_clock(self.saved_s)} of starts saved)"
                if self.kept else "")
        share = f" ({100 * self.start_s / self.span_s:.0f}%)" if self.span_s > 0 else ""
        together = (f" ({self.together} of them together, in {self.batches} batch(es); time "
                    "that starts overlap counts once)" if self.batches else "")
        servers = (f" ({len(self.servers)} of them a cache server beside an engine: "
                   + "; ".join(self.servers) + ")" if self.servers else "")
        return (f"Engine starts in run {self.run_id}: {self.starts} start(s){servers}{together} "
                "took "
                f"{_clock(self.start_s)} of its {_clock(self.span_s)}{share}, first launch or "
                f"line to last{kept}.")


def latest(book: Notebook) -> Starts | None:
    """The engine starts of the notebook's latest run that started any (None: no startup
    line)."""
    lines = book.of(StartupRecord)
    if not lines or not lines[-1].run_id:
        return None
    run_id = lines[-1].run_id
    mine = [r for r in lines if r.run_id == run_id]
    stamps = [_when(r.recorded_at) for r in book.records if r.run_id == run_id]
    known = [s.timestamp() for s in stamps if s is not None]
    fresh = [r for r in mine if r.reused is None]
    intervals = _intervals(fresh)
    opened = min(known + [begin for begin, _ in intervals], default=0.0)
    span = max(known) - opened if known else 0.0
    kept = [r.reused for r in mine if r.reused is not None]
    batched = [r for r in fresh if r.start_batch]
    return Starts(run_id, span, len(fresh), _union(intervals), len(batched),
                  len({r.start_batch for r in batched}), len(kept),
                  sum(k.probe.reset_s for k in kept),
                  sum(k.start_ready_s or 0.0 for k in kept),
                  tuple(companion_words(r) for r in fresh if is_companion(r)))


def _union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the starts' intervals (launch to ready line, in launch order)."""
    total, reach = 0.0, float("-inf")
    for begin, until in intervals:
        total += max(0.0, until - max(begin, reach))
        reach = max(reach, until)
    return total


def _intervals(fresh: list[StartupRecord]) -> list[tuple[float, float]]:
    """Each start's launch and ready times (epoch seconds), in launch order."""
    return sorted((ready.timestamp() - (r.ready_s or 0.0), ready.timestamp())
                  for r in fresh if (ready := _when(r.recorded_at)) is not None)


def _when(stamp: str) -> datetime | None:
    try:
        return datetime.fromisoformat(stamp)
    except ValueError:
        return None


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"
