"""What every plot of the report shares: the `Plot` it returns, matplotlib on the Agg backend,
the palette, the marker style, the file-name slug, and the saving as PNG and inline SVG.

It draws no plot and reads no notebook: which plots there are is `plots.py`'s, and each plot
is in the module of the lab or question it answers (`plots_load.py`, `plots_pd.py`,
`plots_offload.py`). matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def _style(count: int) -> str:
    """Points joined by a line only when there are several of them."""
    return "o-" if count > 1 else "o"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "label"


def _save(plt: ModuleType, fig: Figure, path: Path, question: str, answer: str) -> Plot:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.rcParams["svg.hashsalt"] = path.stem  # ids unique among the plots of one page
    svg = StringIO()
    fig.savefig(svg, format="svg")
    plt.close(fig)
    text = svg.getvalue()
    return Plot(path, question, answer, text[text.index("<svg"):])  # no XML prolog inline
