"""The P/D lab's own plots: the split/baseline TTFT ratio against prompt length (the boundary,
where it crosses 1), and the bytes per request each source measured against the KV
arithmetic's prediction.

The baseline-vs-split pair is drawn as every pair is, and a capacity search as every search
is (`plots_load.py`); the figure's setup and saving are `plots_figure.py`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.records import BOUNDARY, BoundaryRecord, ComparisonRecord, Notebook
from kvlab.report.plots_figure import COLOURS, Plot, _pyplot, _save, _style, figure, legend, title
from kvlab.report.procedure import boundary_result

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def boundary(book: Notebook, out: Path) -> Plot | None:
    newest: dict[int, BoundaryRecord] = {r.concurrency: r
                                         for r in book.of(BoundaryRecord, BOUNDARY.label)}
    if not any(p.ratio is not None for r in newest.values() for p in r.points):
        return None
    plt = _pyplot()
    fig, (ax,) = figure(plt)
    lengths: set[int] = set()
    for (c, r), colour in zip(sorted(newest.items()), COLOURS, strict=False):
        pts = sorted((p.prompt_tokens_target, p.ratio) for p in r.points if p.ratio is not None)
        ax.plot([x for x, _ in pts], [y for _, y in pts], _style(len(pts)), color=colour,
                label=f"concurrency {c} (point ratios, no interval)")
        lengths |= {x for x, _ in pts}
    ax.axhline(1.0, color="#999999", linewidth=1)
    log_lengths(ax, sorted(lengths))
    question = "At what prompt length does the split pay? (below 1: the split is faster)"
    ax.set(xlabel="prompt tokens", ylabel="TTFT p50, split / baseline")
    title(ax, question)
    ax.set_ylim(bottom=0)
    legend(ax, cols=1)
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
    fig, (ax,) = figure(plt)
    sources = sorted({s for c in newest.values()
                      for s in (c.bytes.observed_bytes_per_request_by_source if c.bytes else {})})
    names = ["predicted", *sources]
    height = 0.8 / len(names)
    top = len(newest) - 1  # the comparisons top to bottom, each a group of bars; long
    for i, (name, colour) in enumerate(zip(names, ("#999999", *COLOURS), strict=False)):
        values = [_bytes_of(c, name) for c in newest.values()]  # names read on the left
        bars = ax.barh([top - j + 0.4 - height / 2 - i * height for j in range(len(newest))],
                       [v / 1e6 if v is not None else 0 for v in values], height, label=name,
                       color=colour)
        ax.bar_label(bars, labels=[f"{v / 1e6:,.2f}" if v is not None else "not measured"
                                   for v in values], padding=2, fontsize=8)  # a small bar too
    ax.set_yticks([top - j for j in range(len(newest))],
                  [label.replace("-vs-", "\nvs ") for label in newest])
    question = "Did the bytes moved per request match the KV arithmetic?"
    ax.set(xlabel="MB per request")
    title(ax, question)
    ax.set_xlim(left=0)
    legend(ax, cols=4)
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


def log_lengths(ax: Axes, lengths: list[int]) -> None:
    """A log axis of prompt lengths, ticked at the lengths measured that stand far enough
    apart to be read (1.5x), named in plain numbers."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    ax.set_xscale("log")
    ticks: list[int] = []
    for x in lengths:
        if not ticks or x >= ticks[-1] * 1.5:
            ticks.append(x)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [f"{x:,}" for x in ticks])
