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
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from kvlab.measure import intervals, paired_rows, tier_sides
from kvlab.records import (
    BASELINE,
    BOUNDARY,
    DISK,
    PRESSURE_OFF,
    PRESSURE_ON,
    QUIET_OFF,
    QUIET_ON,
    SHARED_SINGLE,
    SHARED_STORE,
    SPLIT,
    BoundaryRecord,
    CapacityRecord,
    ComparisonRecord,
    DiskRecord,
    KvSamples,
    LoadRecord,
    Notebook,
    Percentiles,
    ReuseRecord,
    interference_label,
)
from kvlab.report import tier_curve as curves
from kvlab.report.common import latest
from kvlab.report.placement import split_groups
from kvlab.report.procedure import boundary_result
from kvlab.report.turns import Turns, median_interval, p50, turns

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REUSE_LABELS = (QUIET_OFF.label, QUIET_ON.label, SHARED_STORE.label, SHARED_SINGLE.label)
LOAD_PAIRS = ((BASELINE.label, SPLIT.label), (PRESSURE_OFF.label, PRESSURE_ON.label),
              (interference_label(4), interference_label(1)))
COLOURS = ("#1b6ca8", "#d1495b", "#2e933c", "#7b6d8d")


@dataclass(frozen=True)
class Plot:
    """One plot: its PNG file, the question it answers, the answer, and the plot as SVG
    (kept in memory: the page inlines it)."""

    path: Path
    question: str
    answer: str
    svg: str = field(repr=False)


def _pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (imported when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text in the page: smaller, selectable
    return plt


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


def ttft_per_turn(book: Notebook, out: Path) -> Plot | None:
    runs = [(label, r) for label in REUSE_LABELS if (r := latest(book, ReuseRecord, label))]
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    answers = []
    for (label, r), colour in zip(runs, COLOURS * 2, strict=False):
        ttft = [row.ttft_s for row in r.rows]
        ax.plot([str(row.turn) for row in r.rows], ttft, _style(len(ttft)), label=label,
                color=colour)
        later = [t for t in ttft[1:] if t is not None]
        if ttft and ttft[0] and later:
            answers.append(f"{label}: fastest later turn {min(later) / ttft[0]:.2f}x of turn 1")
    question = "Did the later turns of a conversation start faster than the first?"
    ax.set(xlabel="turn", ylabel="TTFT (s)", title=question)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return _save(plt, fig, out / "ttft-per-turn.png", question,
                 "; ".join(answers) or "no later turn answered")


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
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values, colour, style in curves:
        ax.ecdf(values, label=name, color=colour, linestyle=style)
    iv = intervals.ttft(book.path, book.records, row_o, row_b)
    question = f"Where did first-token latency move, {other} against {base}?"
    ax.set(xlabel="TTFT (s)", ylabel="share of requests", ylim=(0, 1.02),
           title=f"{question}\nc={level}: TTFT p50 {iv.cell()}")
    ax.set_xlim(left=0)
    ax.legend(fontsize="small")
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
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.18
    for i, ((label, t), colour) in enumerate(zip(sides, COLOURS, strict=False)):
        _turn_points(ax, t, i * width - width / 2, label, colour)
    question = "Which turns did it speed up? (turn 1: no cache can help it)"
    ax.set(xlabel="turn", ylabel="TTFT p50 (s), 95% interval", title=question)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
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


def _style(count: int) -> str:
    """Points joined by a line only when there are several of them."""
    return "o-" if count > 1 else "o"


def by_concurrency(book: Notebook, out: Path, base: str, other: str) -> Plot | None:
    paired = paired_rows(book.records, other, base)  # one run's two sides
    series = {base: paired[1], other: paired[0]}
    levels = sorted(set(paired[0]) | set(paired[1]))
    if not levels or not all(series.values()):
        return None
    plt = _pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 4))
    where = {lv: i for i, lv in enumerate(levels)}  # levels are categories, not a scale
    for (label, rows), colour in zip(series.items(), COLOURS, strict=False):
        xs = [where[c] for c in sorted(rows)]
        ax1.plot(xs, [_p50(rows[c].ttft_s) for c in sorted(rows)], _style(len(xs)),
                 label=label, color=colour)
        ax2.plot(xs, [_p50(rows[c].tpot_s) for c in sorted(rows)], _style(len(xs)),
                 label=label, color=colour)
    ax1.set(ylabel="TTFT p50 (s)", title="TTFT p50")
    ax2.set(ylabel="TPOT p50 (s)", title="TPOT p50")
    answer = _ratio_panel(ax3, book, base, other, where)
    for ax in (ax1, ax2, ax3):
        ax.set_ylim(bottom=0)
        ax.set_xticks(range(len(levels)), [str(lv) for lv in levels])
        ax.set_xlabel("concurrency")
        ax.set_xlim(-0.5, len(levels) - 0.5)
    ax1.legend(fontsize="small")
    question = f"Did {other} change latency against {base}, level by level?"
    fig.suptitle(question)
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
    ax.set(ylabel=f"TTFT p50, {other} / {base}",
           title=f"TTFT p50 ratio, {intervals.level_words(level)} interval")
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
                label=intervals.NO_DATA)
    if with_bars or points:
        ax.legend(fontsize="small")
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
    fig, ax = plt.subplots(figsize=(7, 4))
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
    ax.set(xlabel=r.unit, ylabel=f"{bound} (s), 95% interval",
           title=f"{question}\ntarget {r.target.slo}")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return _save(plt, fig, out / f"capacity-{_slug(r.label)}.png", question, r.statement)


def _binding(r: CapacityRecord) -> str | None:
    """The bound closest to being missed over the search's probes: the one that limits it."""
    def closeness(bound: str) -> float:
        return max((s.figures[bound].value or 0.0) / r.target.bounds[bound]
                   for s in r.steps if bound in s.figures) if r.target.bounds[bound] else 0.0

    found = [b for b in r.target.bounds if any(b in s.figures for s in r.steps)]
    return max(found, key=closeness) if found else None


def boundary(book: Notebook, out: Path) -> Plot | None:
    newest: dict[int, BoundaryRecord] = {r.concurrency: r
                                         for r in book.of(BoundaryRecord, BOUNDARY.label)}
    if not any(p.ratio is not None for r in newest.values() for p in r.points):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for (c, r), colour in zip(sorted(newest.items()), COLOURS, strict=False):
        pts = sorted((p.prompt_tokens_target, p.ratio) for p in r.points if p.ratio is not None)
        ax.plot([x for x, _ in pts], [y for _, y in pts], _style(len(pts)), color=colour,
                label=f"concurrency {c} (point ratios, no interval)")
    ax.axhline(1.0, color="#999999", linewidth=1)
    ax.set_xscale("log")
    question = "At what prompt length does the split pay? (below 1: the split is faster)"
    ax.set(xlabel="prompt tokens", ylabel="TTFT p50, split / baseline", title=question)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    answer = "; ".join(f"c={c}: {boundary_result(r)[0]}" for c, r in sorted(newest.items()))
    return _save(plt, fig, out / "boundary.png", question, answer)


def bytes_per_request(book: Notebook, out: Path) -> Plot | None:
    """Bytes per request each source measured against the prediction, per comparison."""
    newest: dict[str, ComparisonRecord] = {}
    for c in book.of(ComparisonRecord):
        if c.bytes is not None and c.bytes.observed_bytes_per_request_by_source:
            newest[c.label] = c
    if not newest:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    sources = sorted({s for c in newest.values()
                      for s in (c.bytes.observed_bytes_per_request_by_source if c.bytes else {})})
    names = ["predicted", *sources]
    width = 0.8 / len(names)
    for i, (name, colour) in enumerate(zip(names, ("#999999", *COLOURS), strict=False)):
        values = [_bytes_of(c, name) for c in newest.values()]
        ax.bar([j + i * width for j in range(len(newest))],
               [v / 1e6 if v is not None else 0 for v in values], width, label=name,
               color=colour)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(newest))], list(newest))
    question = "Did the bytes that crossed match the KV arithmetic?"
    ax.set(ylabel="MB per request", title=question)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    answer = "; ".join(f"{label}: {c.bytes.verdict}" for label, c in newest.items()
                       if c.bytes is not None and c.bytes.verdict) or "no byte verdict"
    return _save(plt, fig, out / "bytes-per-request.png", question, answer)


def _bytes_of(c: ComparisonRecord, source: str) -> float | None:
    seen = c.bytes
    if seen is None:
        return None
    if source == "predicted":
        return float(seen.predicted_bytes_per_request) \
            if seen.predicted_bytes_per_request else None
    value = seen.observed_bytes_per_request_by_source.get(source)
    return float(value) if value is not None else None


def tier_curve(book: Notebook, out: Path) -> Plot | None:
    """The oracle's hit share against host-tier size, replayed from the newest tier-off run
    under pressure; the measured hit shares of the runs at their tier sizes beside it."""
    sides = tier_sides(book.records)
    off, on = sides[PRESSURE_OFF.label], sides[PRESSURE_ON.label]
    row = off[max(off)] if off else None
    o = row.oracle if row is not None else None
    points = [(p.tier_blocks, p.hit_share) for p in (o.tier_curve if o else [])
              if p.hit_share is not None]
    if o is None or len(points) < 2 or not o.device_blocks:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [b / o.device_blocks for b, _ in points]
    ys = [s * 100 for _, s in points]
    ax.plot(xs, ys, "o-", color=COLOURS[0], label="the oracle (no engine ran these sizes)")
    if o.measured_share is not None:
        ax.plot([0], [o.measured_share * 100], "s", color=COLOURS[1],
                label="measured, tier off")
    tier_on = on[max(on)].oracle if on else None
    measured_on = ""
    if tier_on is not None and tier_on.tier_blocks and tier_on.measured_share is not None:
        at = tier_on.tier_blocks / o.device_blocks
        ax.plot([at], [tier_on.measured_share * 100], "D", color=COLOURS[2],
                label="measured, tier on")
        measured_on = (f"; measured with the tier on ({at:.1f} device caches): "
                       f"{tier_on.measured_share:.1%}")
    question = "How much host tier would this workload use? (the tier-off run replayed)"
    ax.set(xlabel="host tier, in device caches", ylabel="prompt tokens cached (%)",
           title=question)
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small")
    return _save(plt, fig, out / "tier-size-oracle.png", question,
                 _enough(points, o.device_blocks) + measured_on)


def ram_curve(book: Notebook, out: Path) -> Plot | None:
    """llama.cpp's RAM cache against its size (`report/tier_curve.py`)."""
    return size_curve(book, out, curves.RAM)


def host_curve(book: Notebook, out: Path) -> Plot | None:
    """vLLM's host tier against its size (`report/tier_curve.py`)."""
    return size_curve(book, out, curves.HOST)


def size_curve(book: Notebook, out: Path, knob: curves.Knob) -> Plot | None:
    """A tier against its size: TTFT p50 against none with its interval, and the returning
    turns recomputed; vLLM's adds a panel of the returning turns' hit share, measured with
    its interval over the oracle's line."""
    tc = curves
    found = tc.points(book, knob)
    sized = [(p.size, p.ttft) for p in found if p.ttft is not None and p.ttft.ratio is not None]
    line = tc.oracle_line(found, knob) if knob is tc.HOST else []
    if len(sized) < 2 and not (line and knob is tc.HOST):
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(2 if knob is tc.HOST else 1, 1, figsize=(7, 7 if knob is tc.HOST
                                                                     else 4), squeeze=False)
    ax = axes[0][0]
    ys = [float(iv.ratio or 0) for _, iv in sized]
    lows = [y - (iv.low if iv.low is not None else y) for (_, iv), y in zip(sized, ys,
                                                                         strict=True)]
    highs = [(iv.high if iv.high is not None else y) - y for (_, iv), y in zip(sized, ys,
                                                                            strict=True)]
    ax.errorbar([x for x, _ in sized], ys, yerr=[lows, highs], fmt="o-", color=COLOURS[0],
                capsize=3, label=f"TTFT p50 against no {knob.tier} (95% interval)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    turns = ax.twinx()
    turns.plot([p.size for p in found], [p.recomputed or 0 for p in found], "s--",
               color=COLOURS[1], label="returning turns recomputed")
    turns.set_ylabel("returning turns recomputed")
    question = f"How much {knob.tier} is worth having? ({knob.row.how})"
    # a ratio's interval from two repeats can span 0.1x to 10x: a log axis keeps 1x readable
    ax.set_yscale("log")
    ax.set(xlabel=f"{knob.setting} ({knob.unit})", ylabel="TTFT p50, against none",
           title=textwrap.fill(question, 60))
    handles = [*ax.get_legend_handles_labels()[0], *turns.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize="small", loc="upper right")
    if knob is tc.HOST:
        _share_panel(axes[1][0], book, found, line, knob)
    fig.tight_layout()
    name = "llama-ram-curve.png" if knob is tc.RAM else "offload-tier-curve.png"
    words = tc.answer(found, knob) if len(sized) else tc.oracle_words(line, knob) or ""
    return _save(plt, fig, out / name, question, words)


def _share_panel(ax: Axes, book: Notebook, found: list[curves.CurvePoint],
                 line: list[tuple[float, float]], knob: curves.Knob) -> None:
    """The returning turns' hit share against size: the oracle's line, the measured points."""
    tc = curves
    if line:
        ax.plot([x for x, _ in line], [y * 100 for _, y in line], "-", color=COLOURS[3],
                label="the oracle (tier-off runs replayed; no engine ran these)")
    for p in found:
        got = tc.returning_share(book.path, p.rows)
        if got is None:
            continue
        low = got.share - got.low if got.low is not None else 0.0
        high = got.high - got.share if got.high is not None else 0.0
        ax.errorbar([p.size], [got.share * 100], yerr=[[low * 100], [high * 100]], fmt="D",
                    color=COLOURS[2], capsize=3)
    ax.plot([], [], "D", color=COLOURS[2], label="measured (95% interval over the turns)")
    ax.set(xlabel=f"{knob.setting} ({knob.unit})", ylabel="returning turns cached (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize="small", loc="lower right")


def _enough(points: list[tuple[int, float]], device: int) -> str:
    """The smallest replayed tier that reaches 90% of the oracle's largest gain."""
    base, best = points[0][1], max(s for _, s in points)
    if best <= base:
        return "no tier size raised the oracle's hit share: nothing came back after eviction"
    size = next(b for b, s in points if s - base >= 0.9 * (best - base))
    return (f"the oracle reaches 90% of its gain ({base:.1%} to {best:.1%} of prompt tokens "
            f"cached) with a tier of {size / device:g} device caches ({size:,} blocks)")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "label"


def disk(book: Notebook, out: Path) -> Plot | None:
    r = latest(book, DiskRecord, DISK.label)
    if r is None or r.cold_ttft_s is None:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["cold prefill", "restore", "TTFT after restore"]
    values = [r.cold_ttft_s * 1000, r.restore_ms or 0, (r.post_restore_ttft_s or 0) * 1000]
    bars = ax.bar(names, values, color=["#999999", COLOURS[0], COLOURS[2]])
    ax.bar_label(bars, labels=[f"{v:,.1f} ms" for v in values])  # small bars stay readable
    question = "Is restoring a slot from disk faster than prefilling it cold?"
    ax.set(ylabel="milliseconds",
           title=f"{question}\n{r.prompt_tokens} tokens, {r.kv_cache_type} KV")
    ax.set_ylim(bottom=0)
    after = r.post_restore_ttft_s
    answer = (f"first token after restore {after * 1000:,.1f} ms against {values[0]:,.1f} ms "
              f"cold ({r.verdict})" if after is not None else str(r.verdict))
    return _save(plt, fig, out / "disk-restore-vs-cold.png", question, answer)


def kv_usage(book: Notebook, out: Path) -> Plot | None:
    pair = tier_sides(book.records)  # a tier that held the working set
    sampled = [(label, samples) for label in (PRESSURE_OFF.label, PRESSURE_ON.label)
               if (rows := pair[label]) and (samples := rows[max(rows)].kv_usage_samples)]
    if not sampled:
        return None
    on_rows = pair[PRESSURE_ON.label]
    on_row = on_rows[max(on_rows)] if on_rows else None
    moved = _tier_moved(on_row) if on_row is not None else None
    traffic = _tier_series(on_row.kv_usage_samples) if on_row is not None else None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2 if moved else 1, figsize=(12 if moved else 7, 4),
                             squeeze=False)
    ax = axes[0][0]
    peaks = []
    for (label, samples), colour in zip(sampled, COLOURS, strict=False):
        usage = [v * 100 if v is not None else None for v in samples.kv_cache_usage_perc or []]
        times = samples.t_s[: len(usage)]
        ax.plot(times, usage, "-" if len(usage) > 1 else "o", label=label, color=colour)
        seen = [u for u in usage if u is not None]
        if seen:
            peaks.append(f"{label} peaked at {max(seen):.0f}%")
    question = "Was the device KV cache full while the load ran, and what did the tier move?"
    ax.set(xlabel="seconds into the run", ylabel="KV cache usage (%)", ylim=(0, 105),
           title="device KV cache usage")
    ax.legend(fontsize="small")
    if moved:
        if traffic:
            _traffic_panel(axes[0][1], traffic, moved["tier size"])
        else:
            _tier_panel(axes[0][1], moved)
        peaks.append("the tier stored {:.2f} GB and read back {:.2f} GB (its size {:.2f} GB)"
                     .format(*(v / 1e9 for v in moved.values())))
    fig.suptitle(question)
    return _save(plt, fig, out / "kv-usage.png", question, "; ".join(peaks) or "not sampled")


def _tier_moved(row: LoadRecord) -> dict[str, float] | None:
    """What the tier-on run's host tier stored and read back (vLLM's counters over the run)
    and its size, in bytes; None when this vLLM counted none."""
    stored = row.metric_deltas.get("offload_store_bytes")
    loaded = row.metric_deltas.get("offload_load_bytes")
    planned = row.pressure.planned if row.pressure is not None else None
    size = planned.host_tier_bytes if planned is not None else None
    if stored is None or loaded is None or not size:
        return None
    return {"stored": float(stored), "read back": float(loaded), "tier size": float(size)}


def _tier_series(samples: KvSamples | None
                 ) -> dict[str, tuple[list[float], list[float]]] | None:
    """The tier's bytes written and read back over the run (GB since its first sample),
    where the run sampled vLLM's offload counters."""
    if samples is None:
        return None
    found = {}
    for name, series in (("written to the tier", samples.offload_store_bytes),
                         ("read back", samples.offload_load_bytes)):
        kept = [(t, v) for t, v in zip(samples.t_s, series or [], strict=False)
                if v is not None]
        if len(kept) > 1:
            first = kept[0][1]
            found[name] = ([t for t, _ in kept], [(v - first) / 1e9 for _, v in kept])
    return found or None


def _traffic_panel(ax: Axes, traffic: dict[str, tuple[list[float], list[float]]],
                   size: float) -> None:
    for (name, (times, gb)), colour in zip(traffic.items(), (COLOURS[0], COLOURS[2]),
                                           strict=False):
        ax.plot(times, gb, "-", label=name, color=colour)
    ax.axhline(size / 1e9, color="#999999", linestyle="--", label="the tier's size")
    ax.set(xlabel="seconds into the run", ylabel="GB since the run began (vLLM's counters)",
           title="host tier traffic over time, tier on")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")


def _tier_panel(ax: Axes, moved: dict[str, float]) -> None:
    bars = ax.bar(list(moved), [v / 1e9 for v in moved.values()],
                  color=[COLOURS[0], COLOURS[2], "#999999"])
    ax.bar_label(bars, labels=[f"{v / 1e9:,.2f} GB" for v in moved.values()])
    ax.set(ylabel="GB over the run (vLLM's counters)", title="host tier traffic, tier on")
    ax.set_ylim(0, max(moved.values()) / 1e9 * 1.15)


def _save(plt: ModuleType, fig: Figure, path: Path, question: str, answer: str) -> Plot:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.rcParams["svg.hashsalt"] = path.stem  # ids unique among the plots of one page
    svg = StringIO()
    fig.savefig(svg, format="svg")
    plt.close(fig)
    text = svg.getvalue()
    return Plot(path, question, answer, text[text.index("<svg"):])  # no XML prolog inline
