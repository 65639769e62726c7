"""Each decision's chart, drawn beside it: the figures its answer rests on (`Decision.chart`),
one row per figure. A ratio is a point on a log axis with its 95% interval, a line at 1 and
which side of it is faster (green: the interval lies below 1; red: above; grey: it holds 1 or
there is none); seconds and shares are points from zero, a share as a bar.

It draws only what a decision carries: which figures those are is each decision's module's
(`decisions_host.py`, `decisions_tiers.py`, `decisions_pd.py`, `replicas.py`); the report's
other plots are `plots.py`'s, and the saving `plots_figure.py`'s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.report.decisions_common import Decision, Mark, Panel
from kvlab.report.plots_figure import COLOURS, Plot, _pyplot, _save, _slug

if TYPE_CHECKING:
    from matplotlib.axes import Axes

WIDTH_IN = (4.2, 5.4)  # the chart's width beside the decision's words: one panel, two
ROW_IN, FRAME_IN = 0.19, 0.4  # inches a row, and what the axis and its words take
FASTER, SLOWER, EITHER = COLOURS[2], "#c0392b", "#8a9096"
RATIO_TICKS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100,
               200, 500, 1000)


def decision_plot(d: Decision, out: Path) -> Plot | None:
    """`d`'s chart, or None when it carries no figure."""
    if not d.chart:
        return None
    plt = _pyplot()
    rows = max(len(p.marks) for p in d.chart)
    with plt.rc_context({"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8}):
        size = (WIDTH_IN[min(len(d.chart), 2) - 1], FRAME_IN + ROW_IN * rows)
        fig, axes = plt.subplots(1, len(d.chart), figsize=size, sharey=True, squeeze=False,
                                 layout="constrained")
        for i, (ax, panel) in enumerate(zip(axes[0], d.chart, strict=True)):
            _panel(ax, panel, rows, labels=i == 0)
        fig.get_layout_engine().set(h_pad=0.02, w_pad=0.04)
        fig.patch.set_alpha(0)  # on the decision's own background
        for ax in axes[0]:
            ax.patch.set_alpha(0)
        return _save(plt, fig, out / f"decision-{_slug(d.question.lower())}.png",
                     d.question, d.head)


def _panel(ax: Axes, panel: Panel, rows: int, *, labels: bool) -> None:
    ys = [rows - 1 - i for i in range(len(panel.marks))]  # the first figure on top
    ax.set_ylim(-0.6, rows - 0.4)
    if labels:
        ax.set_yticks(ys, [m.name for m in panel.marks])
        for tick, m in zip(ax.get_yticklabels(), panel.marks, strict=True):
            tick.set_fontweight("bold" if m.chosen else "normal")
    ax.tick_params(axis="y", length=0, labelleft=labels)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if panel.scale == "share":
        ax.barh(ys, [m.value * 100 for m in panel.marks], height=0.5, color=COLOURS[0])
        ax.set_xlim(0, 100)
        _under(ax, 0.5, panel.title, "black")
        return
    for y, m in zip(ys, panel.marks, strict=True):
        colour = _colour(m) if panel.scale == "ratio" else COLOURS[0]
        low, high = m.low if m.low is not None else m.value, m.high if m.high is not None \
            else m.value
        ax.errorbar([m.value], [y], xerr=[[m.value - low], [high - m.value]], fmt="o",
                    markersize=4, capsize=2, color=colour, elinewidth=1.2)
    if panel.scale == "ratio":
        _ratio_axis(ax, panel)
    else:
        _seconds_axis(ax, panel)


def _colour(m: Mark) -> str:
    """Green where the interval lies below 1, red above, grey where it holds 1 (a point
    without an interval is coloured by its side, as its words say it)."""
    low = m.low if m.low is not None else m.value
    high = m.high if m.high is not None else m.value
    return FASTER if high < 1 else SLOWER if low > 1 else EITHER


def _span(panel: Panel) -> tuple[float, float]:
    values = [v for m in panel.marks for v in (m.value, m.low, m.high) if v is not None and v > 0]
    return min(values), max(values)


def _ratio_axis(ax: Axes, panel: Panel) -> None:
    """A log axis holding 1 and every interval, ticks at 1-2-5 steps named as ratios, and
    which side of 1 is which in words above it."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    low, high = _span(panel)
    low, high = min(low, 1.0) / 1.6, max(high, 1.0) * 1.6
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ticks = [t for t in RATIO_TICKS if low <= t <= high]
    if len(ticks) > 5:  # decades only, and 1
        ticks = [t for t in ticks if math.log10(t).is_integer()]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.axvline(1.0, color="#555555", linewidth=0.8, zorder=0)
    _under(ax, 0.0, f"← {panel.below}", FASTER)
    _under(ax, 0.5, panel.title, "black")
    _under(ax, 1.0, f"{panel.above} →", SLOWER)


def _under(ax: Axes, x: float, words: str, colour: str) -> None:
    """`words` on one line under the tick labels, at `x` of the axes' width (0: from its
    left end, 1: to its right end)."""
    ax.annotate(words, (x, 0), xycoords="axes fraction", xytext=(0, -19),
                textcoords="offset points", va="top", color=colour,
                ha="left" if x == 0 else "right" if x == 1 else "center")


def _seconds_axis(ax: Axes, panel: Panel) -> None:
    """From zero, or on a log axis where the figures span more than 30x."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    low, high = _span(panel)
    if high / low > 30:
        ax.set_xscale("log")
        ax.set_xlim(low / 1.6, high * 1.6)
    else:
        ax.set_xlim(0, high * 1.1)
        ax.xaxis.set_major_locator(MaxNLocator(3))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _seconds(v)))
    _under(ax, 0.5, panel.title, "black")


def _seconds(value: float) -> str:
    """`50 ms`, `1.5 s`."""
    if value == 0:
        return "0"
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"
