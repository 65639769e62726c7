"""The plots of load runs that either lab draws the same way: a pair's two sides overlaid
(baseline vs split, tier off vs on, 4 slots vs 1) as TTFT CDFs (first and returning turns
apart for user sessions), TTFT p50 by turn number with 95% intervals, and TTFT and TPOT p50 by
concurrency beside the TTFT p50 ratio with its interval; and each capacity search's probes
against its target.

Which pairs are drawn is `plots.py`'s; the plots only one lab asks for are `plots_pd.py`'s and
`plots_offload.py`'s; the figure's setup and saving `plots_figure.py`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvlab.measure import intervals, paired_rows
from kvlab.records import CapacityRecord, LoadRecord, Notebook, Percentiles
from kvlab.report.plots_figure import (
    COLOURS,
    Plot,
    _pyplot,
    _save,
    _slug,
    _style,
    figure,
    gaps,
    legend,
    suptitle,
    title,
    ylabel,
)
from kvlab.report.turns import Turns, median_interval, p50, turns

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _pair(book: Notebook, base: str, other: str
          ) -> tuple[int, LoadRecord, LoadRecord] | None:
    """The highest level both sides of one run measured, and its two rows (base, other)."""
    a, b = paired_rows(book.records, other, base)
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    return shared[-1], b[shared[-1]], a[shared[-1]]


def _ttfts(book: Notebook, row: LoadRecord) -> np.ndarray | None:
    side = intervals.side(book.path, book.records, row)
    if side is None:
        return None
    pooled = np.concatenate([run[:, 0] for run in side.runs]) if side.runs else np.array([])
    pooled = pooled[np.isfinite(pooled)]
    return pooled if len(pooled) else None


def cdf_pair(book: Notebook, out: Path, base: str, other: str) -> Plot | None:
    """Both sides' TTFT distributions on one axis (first and returning turns apart)."""
    pair = _pair(book, base, other)
    if pair is None:
        return None
    level, row_b, row_o = pair
    curves: list[tuple[str, np.ndarray, str, str]] = []
    for (label, row), colour in zip(((base, row_b), (other, row_o)), COLOURS, strict=False):
        split = turns(book, row)
        if split is not None and split.first and split.later:
            curves += [(f"{label}, returning turns ({len(split.later)})",
                        np.array(split.later), colour, "-"),
                       (f"{label}, first turns ({len(split.first)})", np.array(split.first),
                        colour, ":")]
        elif (ttft := _ttfts(book, row)) is not None:
            curves.append((f"{label} ({len(ttft)} requests)", ttft, colour, "-"))
    if len({c[0].split(",")[0].split(" (")[0] for c in curves}) < 2:
        return None
    plt = _pyplot()
    fig, (ax,) = figure(plt)
    for name, values, colour, style in curves:
        ax.ecdf(values, label=name, color=colour, linestyle=style)
    iv = intervals.ttft(book.path, book.records, row_o, row_b)
    question = f"Where did first-token latency move, {other} against {base}?"
    ax.set(xlabel="TTFT (s)", ylabel="share of requests", ylim=(0, 1.02))
    title(ax, f"{question}\nc={level}: TTFT p50 {iv.cell()}")
    ax.set_xlim(left=0)
    legend(ax, cols=1 if len(curves) < 3 else 2)
    return _save(plt, fig, out / f"ttft-cdf-{_slug(base)}-vs-{_slug(other)}.png", question,
                 f"at concurrency {level}, TTFT p50 {other} / {base}: {iv.cell()}")


def turn_pair(book: Notebook, out: Path, base: str, other: str) -> Plot | None:
    """TTFT p50 by turn number with 95% intervals, both sides of a user-session pair."""
    pair = _pair(book, base, other)
    if pair is None:
        return None
    level, row_b, row_o = pair
    sides = [(label, t) for label, row in ((base, row_b), (other, row_o))
             if (t := turns(book, row)) is not None]
    if len(sides) < 2:
        return None
    plt = _pyplot()
    fig, (ax,) = figure(plt)
    width = 0.18
    for i, ((label, t), colour) in enumerate(zip(sides, COLOURS, strict=False)):
        _turn_points(ax, t, i * width - width / 2, label, colour)
    question = "Which turns did it speed up? (turn 1: no cache can help it)"
    ax.set(xlabel="turn", ylabel="TTFT p50 (s), 95% interval")
    title(ax, question)
    ax.set_ylim(bottom=0)
    legend(ax)
    words = "; ".join(f"{label}: turn 1 {_mid(t.first)} s, later turns {_mid(t.later)} s"
                      for label, t in sides)
    return _save(plt, fig, out / f"ttft-by-turn-{_slug(base)}-vs-{_slug(other)}.png",
                 question, f"at concurrency {level}, {words}")


def _mid(values: list[float]) -> str:
    mid = p50(values)
    return f"{mid:.3f}" if mid is not None else "n/a"


def _turn_points(ax: Axes, t: Turns, shift: float, label: str, colour: str) -> None:
    xs, ys, lows, highs = [], [], [], []
    for turn, values in t.by_turn.items():
        mid, band = p50(values), median_interval(values)
        if mid is None:
            continue
        xs.append(turn + 1 + shift)
        ys.append(mid)
        lows.append(mid - band[0] if band else 0.0)
        highs.append(band[1] - mid if band else 0.0)
    ax.errorbar(xs, ys, yerr=[lows, highs], fmt="o", capsize=3, color=colour, label=label)
    ax.set_xticks(sorted({round(x) for x in xs}))


def by_concurrency(book: Notebook, out: Path, base: str, other: str) -> Plot | None:
    paired = paired_rows(book.records, other, base)  # one run's two sides
    series = {base: paired[1], other: paired[0]}
    levels = sorted(set(paired[0]) | set(paired[1]))
    if not levels or not all(series.values()):
        return None
    plt = _pyplot()
    fig, (ax1, ax2, ax3) = figure(plt, "wide", cols=3)
    where = {lv: i for i, lv in enumerate(levels)}  # levels are categories, not a scale
    for (label, rows), colour in zip(series.items(), COLOURS, strict=False):
        xs = [where[c] for c in sorted(rows)]
        ax1.plot(xs, gaps([_p50(rows[c].ttft_s) for c in sorted(rows)]), _style(len(xs)),
                 label=label, color=colour)
        ax2.plot(xs, gaps([_p50(rows[c].tpot_s) for c in sorted(rows)]), _style(len(xs)),
                 label=label, color=colour)
    ax1.set(ylabel="TTFT p50 (s)", title="TTFT p50")
    ax2.set(ylabel="TPOT p50 (s)", title="TPOT p50")
    answer = _ratio_panel(ax3, book, base, other, where)
    for ax in (ax1, ax2, ax3):
        ax.set_ylim(bottom=0)
        ax.set_xticks(range(len(levels)), [str(lv) for lv in levels])
        ax.set_xlabel("concurrency")
        ax.set_xlim(-0.5, len(levels) - 0.5)
    legend(ax1, cols=1)
    question = f"Did {other} change latency against {base}, level by level?"
    suptitle(fig, question)
    return _save(plt, fig, out / f"{base}-vs-{other}.png", question, answer)


def _p50(p: Percentiles | None) -> float | None:
    return p.p50 if p is not None else None


def _ratio_panel(ax: Axes, book: Notebook, base: str, other: str,
                 where: dict[int, int]) -> str:
    """TTFT p50 other / base by level, each with its interval (95%, or a sequential run's
    level) as an error bar; the answer in words."""
    a, b = paired_rows(book.records, other, base)
    found = intervals.pair_levels(book.path, book.records, a, b, (intervals.BY_KEY["ttft_p50"],))
    level = max((m["ttft_p50"].confidence for m in found.values()), default=intervals.CONFIDENCE)
    ylabel(ax, f"TTFT p50, {other} / {base}")
    title(ax, f"TTFT p50 ratio, {intervals.level_words(level)} interval")
    ax.axhline(1.0, color="#999999", linewidth=1)
    with_bars = [(lv, m["ttft_p50"]) for lv, m in found.items() if m["ttft_p50"].measured]
    points = [(lv, point) for lv, m in found.items()
              if not m["ttft_p50"].measured and (point := m["ttft_p50"].ratio) is not None]
    if with_bars:
        x = [where[lv] for lv, _ in with_bars]
        y = np.array([iv.ratio for _, iv in with_bars], dtype=float)
        low = np.array([iv.low for _, iv in with_bars], dtype=float)
        high = np.array([iv.high for _, iv in with_bars], dtype=float)
        ax.errorbar(x, y, yerr=[y - low, high - y], fmt="o", capsize=4, label="with interval")
    if points:
        ax.plot([where[lv] for lv, _ in points], [point for _, point in points], "x",
                label="point ratio, no interval (see the answer)")
    if points:  # say which marks have no interval
        legend(ax, cols=1)
    return "; ".join(f"c={lv}: {m['ttft_p50'].cell()}" for lv, m in sorted(found.items())) \
        or "no level with a ratio"


def _newest_capacities(book: Notebook) -> list[CapacityRecord]:
    newest: dict[str, CapacityRecord] = {}
    for r in book.of(CapacityRecord):
        if r.steps:
            newest[r.label] = r
    return [newest[k] for k in sorted(newest)]


def capacity(book: Notebook, out: Path, r: CapacityRecord) -> Plot | None:
    """A capacity search's probes: the bound's percentile with its interval against load,
    the target as a line, the bracket found shaded."""
    bound = _binding(r)
    probes = [(s.load, s.figures[bound], s.met) for s in r.steps
              if bound is not None and bound in s.figures
              and s.figures[bound].value is not None]
    if bound is None or not probes:
        return None
    plt = _pyplot()
    fig, (ax,) = figure(plt)
    for met, colour, name in ((True, COLOURS[2], "met"), (False, COLOURS[1], "missed")):
        kept = [(x, f) for x, f, m in probes if m is met]
        if not kept:
            continue
        ys = np.array([f.value for _, f in kept], dtype=float)
        low = np.array([f.low if f.low is not None else f.value for _, f in kept], dtype=float)
        high = np.array([f.high if f.high is not None else f.value for _, f in kept],
                        dtype=float)
        ax.errorbar([x for x, _ in kept], ys, yerr=[ys - low, high - ys], fmt="o", capsize=4,
                    color=colour, label=name)
    ax.axhline(r.target.bounds[bound], color="#555555", linestyle="--",
               label=f"target {bound} {r.target.bounds[bound]:g} s")
    if r.capacity is not None and r.missed_at is not None:
        ax.axvspan(float(r.capacity), float(r.missed_at), color="#f2d388", alpha=0.4,
                   label="bracket found")
    question = f"How much load meets the latency target? ({r.label})"
    ax.set(xlabel=r.unit, ylabel=f"{bound} (s), 95% interval")
    title(ax, f"{question}\ntarget {r.target.slo}")
    ax.set_ylim(bottom=0)
    legend(ax, cols=4)
    return _save(plt, fig, out / f"capacity-{_slug(r.label)}.png", question, r.statement)


def _binding(r: CapacityRecord) -> str | None:
    """The bound closest to being missed over the search's probes: the one that limits it."""
    def closeness(bound: str) -> float:
        return max((s.figures[bound].value or 0.0) / r.target.bounds[bound]
                   for s in r.steps if bound in s.figures) if r.target.bounds[bound] else 0.0

    found = [b for b in r.target.bounds if any(b in s.figures for s in r.steps)]
    return max(found, key=closeness) if found else None
