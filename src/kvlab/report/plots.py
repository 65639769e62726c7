"""The report's plots (PNG for report.md, SVG inlined in report.html; matplotlib's Agg
backend), drawn from the notebook and the per-request files its load rows name. Each plot is
titled with the question it answers, and carries its answer in words (`Plot`).

- TTFT per turn for each reuse run (the quiet tiers, the shared store and its control);
- each comparison's two sides overlaid (baseline vs split, tier off vs on, 4 slots vs 1): the
  TTFT CDFs, first turns and returning turns apart for user sessions; and TTFT by turn number
  with 95% intervals for both sides of a session pair;
- for the same pairs: TTFT and TPOT p50 by concurrency and the TTFT p50 ratio with its 95%
  interval, the levels as categories (one level is a point, never a line);
- each capacity search: the target percentile at every probe with its interval, the target
  and the bracket found;
- the P/D boundary: the split/baseline TTFT ratio against prompt length, where it crosses 1;
- bytes per request, measured by each source against the KV arithmetic's prediction;
- restore against cold prefill for the disk tier; KV-cache usage over time under pressure.

Every linear y axis starts at zero, so a bar's or a point's height is its size.

This module owns which plots are drawn and in what order (`draw_all`), and the pairs of load
runs compared (`LOAD_PAIRS`, which the CSV export shares). It draws none itself: a pair's and
a capacity search's plots are `plots_load.py`'s, the P/D lab's `plots_pd.py`'s, the offload
lab's (reuse turns, tier curves, disk, KV usage) `plots_offload.py`'s, and the figure's setup
and saving `plots_figure.py`'s.
"""

from __future__ import annotations

from pathlib import Path

from kvlab.records import (
    BASELINE,
    PRESSURE_OFF,
    PRESSURE_ON,
    SPLIT,
    Notebook,
    interference_label,
)
from kvlab.report.placement import split_groups
from kvlab.report.plots_figure import Plot
from kvlab.report.plots_load import (
    _newest_capacities,
    by_concurrency,
    capacity,
    cdf_pair,
    turn_pair,
)
from kvlab.report.plots_offload import (
    disk,
    host_curve,
    kv_usage,
    ram_curve,
    tier_curve,
    ttft_per_turn,
)
from kvlab.report.plots_pd import boundary, bytes_per_request

LOAD_PAIRS = ((BASELINE.label, SPLIT.label), (PRESSURE_OFF.label, PRESSURE_ON.label),
              (interference_label(4), interference_label(1)))


def draw_all(book: Notebook, out: Path) -> list[Plot]:
    """Every plot the notebook has data for."""
    out.mkdir(parents=True, exist_ok=True)
    found: list[Plot | None] = [ttft_per_turn(book, out)]
    pairs = [*((BASELINE.label, g.label) for g in split_groups(book)), *LOAD_PAIRS[1:]]
    for base, other in pairs:
        found += [cdf_pair(book, out, base, other), turn_pair(book, out, base, other),
                  by_concurrency(book, out, base, other)]
    found += [capacity(book, out, r) for r in _newest_capacities(book)]
    found += [tier_curve(book, out), ram_curve(book, out), host_curve(book, out),
              boundary(book, out),
              bytes_per_request(book, out),
              disk(book, out), kv_usage(book, out)]
    return [p for p in found if p is not None]
