"""Why the host tier cost time, from the notebook alone (issue 46): the pair's own accounts,
the tax on requests that recall nothing, the shared-first-block control and the floor.

Each part names its source and stays out when its lines are missing, and the whole says
"unexplained" with what was ruled out when no part carries the added time. The figures:
- where the added mean TTFT went: each side's `ttft_account` (vLLM's request histograms:
  waiting to be scheduled, computing the prompt, outside the engine);
- what the tier's loads took: `offload_load_s` and `offload_load_bytes` (vLLM's transfer
  counters), summed over the level, against the added time summed over its requests;
- the tax: first turns (nothing to recall) tier on against off, TTFT p50 with its interval;
- the control (`experiments/tier_why.py`): the same ratio with no block shared across
  conversations. A tax that goes away there is the engine holding requests that share a
  block being loaded (vLLM issue 44294);
- the floor: the loads' bytes at the machine's copy rate (`copy-rate`), beside recomputing
  the recalled tokens at the tier-off run's prefill time per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.measure import intervals, ttft_difference
from kvlab.records import (
    COPY_RATE,
    PRESSURE_OFF_DISTINCT,
    PRESSURE_ON_DISTINCT,
    CopyRateRecord,
    LoadRecord,
    Notebook,
    requests,
)

CONVOY = ("the engine holds requests that share a block being loaded until the load ends "
          "(vLLM issue 44294)")
TRY_CONVOY = ("what to try: a vLLM with that issue's fix (PR 44295), or a tier only where "
              "recalls are long enough to outweigh the hold")


@dataclass(frozen=True)
class Tax:
    """First turns (nothing to recall), tier on against off."""

    ratio: intervals.Interval
    counts: tuple[int, int]

    @property
    def measured_above(self) -> bool:
        return self.ratio.measured and (self.ratio.low or 0) > 1.0

    def words(self) -> str:
        return (f"first turns, which recall nothing, TTFT p50 {self.ratio.cell()} "
                f"({self.counts[0]} and {self.counts[1]} requests)")


def first_turns(book: Notebook, row: LoadRecord) -> np.ndarray | None:
    """The metrics' columns of a session run's first turns (None: no per-request file)."""
    lines = requests.of_row(book.path, row.requests_file, row.requests_sha256)
    if lines is None:
        return None
    return intervals.columns([line for line in lines if line.turn == 0])


def tax(book: Notebook, on: LoadRecord, off: LoadRecord) -> Tax | None:
    a, b = first_turns(book, on), first_turns(book, off)
    if a is None or b is None or not len(a) or not len(b):
        return None
    metric = intervals.BY_KEY["ttft_p50"]
    return Tax(intervals.ratio_interval(metric, [a], [b], ("tier on", "tier off")),
               (len(a), len(b)))


def where_added(on: LoadRecord, off: LoadRecord) -> str:
    """The added mean TTFT split by the engine's own accounts ("" without both)."""
    a, b = on.ttft_account, off.ttft_account
    return ttft_difference(a, b) if a is not None and b is not None else ""


def loads(on: LoadRecord) -> str:
    """What the tier's loads took against the time it added over the level ("": no
    counters)."""
    took, moved = on.metric_deltas.get("offload_load_s"), on.metric_deltas.get(
        "offload_load_bytes")
    if took is None or moved is None:
        return ""
    return (f"the tier's loads took {float(took):.3f} s in all for {float(moved) / 1e9:.2f} GB "
            "(vLLM's transfer counters)")


def added_total(on: LoadRecord, off: LoadRecord) -> float | None:
    """The mean TTFT added, times the tier-on level's requests: seconds summed."""
    a, b = on.ttft_account, off.ttft_account
    if a is None or b is None or not on.ok:
        return None
    return (a.client_ttft - b.client_ttft) * on.ok


def floor(book: Notebook, on: LoadRecord, off: LoadRecord) -> str:
    """The loads' bytes at the machine's copy rate, beside recomputing the recalled tokens."""
    rate = next((r for r in reversed(book.records) if isinstance(r, CopyRateRecord)
                 and r.label == COPY_RATE.label), None)
    moved = on.metric_deltas.get("offload_load_bytes")
    if rate is None or moved is None:
        return ""
    words = (f"the floor: {float(moved) / 1e9:.2f} GB at this machine's "
             f"{rate.gb_per_s:.1f} GB/s {rate.direction} ({rate.framework}) is "
             f"{float(moved) / (rate.gb_per_s * 1e9):.3f} s")
    recalled = on.metric_deltas.get("external_prefix_cache_hits")
    per_token = _prefill_per_token(off)
    if recalled and per_token:
        words += (f", against {float(recalled) * per_token:.2f} s to recompute its "
                  f"{float(recalled):,.0f} tokens at the tier-off run's "
                  f"{per_token * 1e6:.0f} µs a token")
    return words


def _prefill_per_token(off: LoadRecord) -> float | None:
    """Seconds of prompt computing per uncached prompt token in the tier-off run."""
    a = off.ttft_account
    computed = off.metric_deltas.get("prompt_tokens_local_compute")
    if a is None or a.prefill is None or not computed or not a.requests:
        return None
    return a.prefill * a.requests / float(computed)


def control(book: Notebook) -> tuple[Tax | None, str]:
    """The shared-first-block control's tax, and its words ("" where it did not run)."""
    rows = {label: r for r in book.records if isinstance(r, LoadRecord)
            and (label := r.label) in (PRESSURE_ON_DISTINCT.label, PRESSURE_OFF_DISTINCT.label)}
    on, off = rows.get(PRESSURE_ON_DISTINCT.label), rows.get(PRESSURE_OFF_DISTINCT.label)
    if on is None or off is None:
        return None, ""
    found = tax(book, on, off)
    return found, (f"with no block shared across conversations, {found.words()}"
                   if found else "")


def cause(book: Notebook, on: LoadRecord, off: LoadRecord, cost: bool = True) -> str:
    """Why a tier did not pay, in words with their figures ("": nothing to say); `cost`: it
    cost time measurably, so the cause is named or said to be unexplained."""
    parts = [p for p in (where_added(on, off), _loads_against(on, off)) if p]
    first = tax(book, on, off)
    if first is not None:
        parts.append(first.words())
    held, held_words = control(book)
    if held_words:
        parts.append(held_words)
    if f := floor(book, on, off):
        parts.append(f)
    if not parts:
        return ""
    named = cost or (first is not None and first.measured_above)  # a tax to account for
    return "Why: " + "; ".join(parts) + (f". {verdict(first, held, on, off)}" if named else "")


def _loads_against(on: LoadRecord, off: LoadRecord) -> str:
    words, total = loads(on), added_total(on, off)
    if words and total is not None and total > 0:
        words += f", against {total:.1f} s added over the level's {on.ok} requests"
    return words


def verdict(first: Tax | None, held: Tax | None, on: LoadRecord, off: LoadRecord) -> str:
    """The cause named, or "unexplained" with what was ruled out."""
    took, total = on.metric_deltas.get("offload_load_s"), added_total(on, off)
    copies_small = took is not None and total is not None and float(took) < 0.2 * total
    if first is not None and first.measured_above and held is not None:
        if not held.measured_above:
            return f"Cause: {CONVOY}; {TRY_CONVOY}"
        return ("Unexplained: first turns were slower with no block shared as well, so the "
                "shared block is ruled out" + ("; so are the copies' own time" if copies_small
                                               else ""))
    if first is not None and first.measured_above:
        return ("The shared-first-block control did not run (`kvlab run offload --part "
                "pressure --why always`): the hold is a lead, not a finding")
    ruled = ["the copies' own time"] if copies_small else []
    return "Unexplained" + (f": ruled out {', '.join(ruled)}" if ruled else "") + \
        "; first turns were not measurably slower"
