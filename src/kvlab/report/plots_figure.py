"""What every plot of the report shares: the `Plot` it returns, matplotlib on the Agg backend,
the palette, the marker style, the file-name slug, the figure's sizes, its title wrapped to
its width, its legend kept off the data, and the saving as PNG and inline SVG.

The sizes are the page's: a plot is drawn at the width it is shown at (a column of the page's
two, or both for a plot of several panels), with its type no smaller than 7 pt when the page
is printed on A4 or Letter, so nothing is shrunk past reading and no word is cut at an edge
(the layout is matplotlib's constrained one, which makes room for every title, label and
legend).

It draws no plot and reads no notebook: which plots there are is `plots.py`'s, and each plot
is in the module of the lab or question it answers (`plots_load.py`, `plots_pd.py`,
`plots_offload.py`, `plots_decision.py`). matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

COLOURS = ("#1b6ca8", "#d1495b", "#2e933c", "#7b6d8d")
Size = Literal["column", "wide", "tall"]
SIZES: dict[Size, tuple[float, float]] = {  # inches: one column of the page, both, one tall
    "column": (6.4, 3.8), "wide": (9.4, 3.3), "tall": (6.4, 6.2)}
TYPE: dict[Any, int] = {"font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10,
                        "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.fontsize": 9,
                        "figure.titlesize": 11}


@dataclass(frozen=True)
class Plot:
    """One plot: its PNG file, the question it answers, the answer, and the plot as SVG
    (kept in memory: the page inlines it)."""

    path: Path
    question: str
    answer: str
    svg: str = field(repr=False)

    @property
    def wide(self) -> bool:
        """Drawn across both of the page's columns."""
        return 'data-wide="1"' in self.svg[:400]


def _pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (imported when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text in the page: smaller, selectable
    plt.rcParams.update(TYPE)
    return plt


def figure(plt: ModuleType, size: Size = "column", cols: int = 1, rows: int = 1,
           **shared: bool) -> tuple[Figure, list[Axes]]:
    """A figure of `size` with `rows` x `cols` axes (flat, row by row), laid out by
    matplotlib's constrained layout; `shared` is `sharex`/`sharey`."""
    fig, axes = plt.subplots(rows, cols, figsize=SIZES[size], squeeze=False,
                             layout="constrained", **shared)
    return fig, [ax for row in axes for ax in row]


def _root(ax: Axes) -> Figure:
    """The figure `ax` is drawn in."""
    fig = ax.get_figure(root=True)
    assert fig is not None, "an axes of the report's figures"
    return fig


def title(ax: Axes, text: str) -> None:
    """`text` as the axes' title, wrapped to the axes' width."""
    width_in = _root(ax).get_figwidth() * ax.get_position().width
    size = float(ax.title.get_fontsize())
    chars = max(20, int(width_in * 72 / (size * 0.58)))
    ax.set_title("\n".join(textwrap.fill(line, chars) for line in text.split("\n")))


def ylabel(ax: Axes, text: str) -> None:
    """`text` as the axes' y label, wrapped to the axes' height."""
    height_in = _root(ax).get_figheight() * ax.get_position().height
    chars = max(16, int(height_in * 72 / (float(ax.yaxis.label.get_fontsize()) * 0.58)))
    ax.set_ylabel(textwrap.fill(text, chars))


def suptitle(fig: Figure, text: str) -> None:
    """`text` over every panel, wrapped to the figure's width."""
    chars = max(30, int(fig.get_figwidth() * 72 / (11 * 0.58)))
    fig.suptitle(textwrap.fill(text, chars))


def legend(ax: Axes, cols: int = 2, handles: Sequence[Artist] | None = None) -> None:
    """The axes' legend (or `handles`') under it, off the data (points, lines and whiskers
    alike) and off the axis' words: under the whole figure where it has one panel, else just
    under the panel's own axis (constrained layout makes the room either way)."""
    from matplotlib.transforms import ScaledTranslation

    fig = _root(ax)
    if handles is None:
        handles = ax.get_legend_handles_labels()[0]
    if not handles:
        return
    labels = [str(h.get_label()) for h in handles]
    ncols = min(cols, len(handles))
    if len({tuple(a.get_position().bounds) for a in fig.axes}) == 1:  # a twin shares it
        fig.legend(handles, labels, loc="outside lower center", ncols=ncols, frameon=False)
        return
    ticks = any(t.get_visible() for t in ax.get_xticklabels()) and ax.xaxis.get_visible()
    words = (float(ax.xaxis.label.get_fontsize()) * 1.3 + 4 if ax.get_xlabel() else 0) + \
        (_tick_size(ax) * 1.3 + 7 if ticks else 0) + 4  # points under the axis
    shift = ScaledTranslation(0, -words / 72, fig.dpi_scale_trans)
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0),
              bbox_transform=ax.transAxes + shift, ncols=ncols, frameon=False)


def _tick_size(ax: Axes) -> float:
    """The x tick labels' size in points."""
    found = ax.get_xticklabels()
    return float(found[0].get_fontsize()) if found else 9.0


def gaps(values: Sequence[float | None]) -> list[float]:
    """`values` with a figure not recorded as NaN: a gap in the line, as matplotlib draws
    one."""
    return [math.nan if v is None else v for v in values]


def _style(count: int) -> str:
    """Points joined by a line only when there are several of them."""
    return "o-" if count > 1 else "o"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "label"


def _save(plt: ModuleType, fig: Figure, path: Path, question: str, answer: str) -> Plot:
    """The figure as PNG at `path` and as SVG text for the page."""
    wide = fig.get_figwidth() >= SIZES["wide"][0]
    fig.savefig(path, dpi=110, facecolor="white")  # readable on a dark page too
    plt.rcParams["svg.hashsalt"] = path.stem  # ids unique among the plots of one page
    svg = StringIO()
    fig.savefig(svg, format="svg", metadata={"Date": None})  # the same page from the same notebook
    plt.close(fig)
    text = svg.getvalue()
    text = text[text.index("<svg"):]  # no XML prolog inline
    if wide:
        text = text.replace("<svg ", '<svg data-wide="1" ', 1)
    return Plot(path, question, answer, text)
