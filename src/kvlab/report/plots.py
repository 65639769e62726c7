"""The report's plots (PNG, matplotlib's Agg backend), drawn from the notebook and the
per-request files its load rows name.

- TTFT per turn for each reuse run (the quiet tiers, the shared store and its control);
- for paired load runs (baseline vs split, tier off vs on, 4 slots vs 1): TTFT and TPOT p50 by
  concurrency, and the TTFT p50 ratio with its 95% interval as error bars (`intervals.py`);
- the TTFT distribution of each load label with per-request data: one CDF per run (level and
  repeat), warm-up and failed requests left out;
- restore against cold prefill for the disk tier;
- KV-cache usage over time where a pressure run sampled it.

Every linear y axis starts at zero, so a bar's or a point's height is its size. A single level
is drawn as points (with its interval), never as a line: one point makes no trend.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from kvlab.measure import compare, intervals
from kvlab.records.models import DiskRecord, LoadRecord, ReuseRecord
from kvlab.records.notebook import Notebook
from kvlab.records.rows import (
    BASELINE,
    DISK,
    PRESSURE_OFF,
    PRESSURE_ON,
    QUIET_OFF,
    QUIET_ON,
    SHARED_SINGLE,
    SHARED_STORE,
    SPLIT,
    interference_label,
)
from kvlab.report.common import latest

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REUSE_LABELS = (QUIET_OFF.label, QUIET_ON.label, SHARED_STORE.label, SHARED_SINGLE.label)
LOAD_PAIRS = ((BASELINE.label, SPLIT.label), (PRESSURE_OFF.label, PRESSURE_ON.label),
              (interference_label(4), interference_label(1)))


def _pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (imported when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_all(book: Notebook, out: Path) -> list[Path]:
    """Every plot the notebook has data for; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [p for p in (ttft_per_turn(book, out), disk(book, out), kv_usage(book, out))
               if p is not None]
    for base, other in LOAD_PAIRS:
        path = by_concurrency(book, out, base, other)
        if path is not None:
            written.append(path)
    for label in sorted({r.label for r in book.of(LoadRecord)}):
        path = ttft_cdf(book, out, label)
        if path is not None:
            written.append(path)
    # the tier too small for the working set: its own run, in files of its own
    for label, rows in compare.tier_sides(book.records, smaller_tier=True).items():
        path = ttft_cdf(book, out, label, rows, "the smaller-tier run")
        if path is not None:
            written.append(path)
    return written


def _style(count: int) -> str:
    """Points joined by a line only when there are several of them."""
    return "o-" if count > 1 else "o"


def ttft_per_turn(book: Notebook, out: Path) -> Path | None:
    runs = [(label, r) for label in REUSE_LABELS if (r := latest(book, ReuseRecord, label))]
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in runs:
        turns = [row.turn for row in r.rows]
        ttft = [row.ttft_s for row in r.rows]
        ax.plot(turns, ttft, _style(len(turns)), label=label)
    ax.set(xlabel="turn", ylabel="TTFT (s)", title="Time to first token per turn")
    ax.set_ylim(bottom=0)
    ax.legend()
    return _save(plt, fig, out / "ttft-per-turn.png")


def by_concurrency(book: Notebook, out: Path, base: str, other: str) -> Path | None:
    paired = compare.paired_rows(book.records, other, base)  # one run's two sides
    series = {base: [paired[1][c] for c in sorted(paired[1])],
              other: [paired[0][c] for c in sorted(paired[0])]}
    if not any(series.values()):
        return None
    plt = _pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 4))
    for label, rows in series.items():
        if not rows:
            continue
        levels = [r.concurrency for r in rows]
        ax1.plot(levels, [r.ttft_s.p50 if r.ttft_s else None for r in rows],
                 _style(len(rows)), label=label)
        ax2.plot(levels, [r.tpot_s.p50 if r.tpot_s else None for r in rows],
                 _style(len(rows)), label=label)
    ax1.set(xlabel="concurrency", ylabel="TTFT p50 (s)", title="TTFT p50")
    ax2.set(xlabel="concurrency", ylabel="TPOT p50 (s)", title="TPOT p50")
    _ratio_panel(ax3, book, base, other)
    for ax in (ax1, ax2, ax3):
        ax.set_ylim(bottom=0)
    ax1.legend()
    return _save(plt, fig, out / f"{base}-vs-{other}.png")


def _ratio_panel(ax: Axes, book: Notebook, base: str, other: str) -> None:
    """TTFT p50 other / base by level, each with its 95% interval as an error bar."""
    a, b = compare.paired_rows(book.records, other, base)
    found = intervals.pair_levels(book.path, book.records, a, b, (intervals.BY_KEY["ttft_p50"],))
    ax.set(xlabel="concurrency", ylabel=f"TTFT p50, {other} / {base}",
           title="TTFT p50 ratio, 95% interval")
    ax.axhline(1.0, color="#999999", linewidth=1)
    with_bars = [(lv, m["ttft_p50"]) for lv, m in found.items() if m["ttft_p50"].measured]
    points = [(lv, point) for lv, m in found.items()
              if not m["ttft_p50"].measured and (point := m["ttft_p50"].ratio) is not None]
    if with_bars:
        x = [lv for lv, _ in with_bars]
        y = np.array([iv.ratio for _, iv in with_bars], dtype=float)
        low = np.array([iv.low for _, iv in with_bars], dtype=float)
        high = np.array([iv.high for _, iv in with_bars], dtype=float)
        ax.errorbar(x, y, yerr=[y - low, high - y], fmt=_style(len(x)), capsize=4,
                    label="with interval")
    if points:
        ax.plot([lv for lv, _ in points], [point for _, point in points], "x",
                label=intervals.NO_DATA)
    if with_bars or points:
        ax.legend(fontsize="small")


def ttft_cdf(book: Notebook, out: Path, label: str, rows: dict[int, LoadRecord] | None = None,
             run: str = "") -> Path | None:
    """One TTFT CDF per run of `label` (each level, each repeat) from its per-request files:
    the newest rows of `label` (the host tier's: a tier that held the working set), or `rows`,
    one `run` of it named in the title and the file name."""
    if rows is None:
        tier = compare.tier_sides(book.records)
        rows = tier[label] if label in tier else compare.load_rows(book.records, label)
    curves = []
    for level in sorted(rows):
        side = intervals.side(book.path, book.records, rows[level])
        if side is None:
            continue
        for row, requests in zip(side.rows, side.runs, strict=True):
            ttft = requests[:, 0][np.isfinite(requests[:, 0])]
            name = f"c={level}" + (f" repeat {row.repeat}" if row.repeat is not None else "")
            if len(ttft):
                curves.append((f"{name} ({len(ttft)} requests)", ttft))
    if not curves:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, ttft in curves:
        ax.ecdf(ttft, label=name)
    ax.set(xlabel="TTFT (s)", ylabel="share of requests", ylim=(0, 1.02),
           title=f"TTFT distribution, {label}" + (f", {run}" if run else "")
           + "\n(ok requests, warm-up left out)")
    ax.set_xlim(left=0)
    ax.legend(fontsize="small")
    return _save(plt, fig, out / f"ttft-cdf-{_slug(label + ('-' + run if run else ''))}.png")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "label"


def disk(book: Notebook, out: Path) -> Path | None:
    r = latest(book, DiskRecord, DISK.label)
    if r is None or r.cold_ttft_s is None:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["cold prefill", "restore", "TTFT after restore"]
    values = [r.cold_ttft_s * 1000, r.restore_ms or 0, (r.post_restore_ttft_s or 0) * 1000]
    bars = ax.bar(names, values, color=["#999999", "#2a7ab9", "#5aae61"])
    ax.bar_label(bars, labels=[f"{v:,.1f} ms" for v in values])  # small bars stay readable
    ax.set(ylabel="milliseconds",
           title=f"Disk tier: {r.prompt_tokens} tokens, {r.kv_cache_type} KV")
    ax.set_ylim(bottom=0)
    return _save(plt, fig, out / "disk-restore-vs-cold.png")


def kv_usage(book: Notebook, out: Path) -> Path | None:
    pair = compare.tier_sides(book.records)  # a tier that held the working set
    sampled = [(label, samples) for label in (PRESSURE_OFF.label, PRESSURE_ON.label)
               if (rows := pair[label]) and (samples := rows[max(rows)].kv_usage_samples)]
    if not sampled:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, samples in sampled:
        usage = [v * 100 if v is not None else None for v in samples.kv_cache_usage_perc or []]
        times = samples.t_s[: len(usage)]
        ax.plot(times, usage, "-" if len(usage) > 1 else "o", label=label)
    ax.set(xlabel="seconds into the run", ylabel="KV cache usage (%)", ylim=(0, 105),
           title="Device KV cache under pressure")
    ax.legend()
    return _save(plt, fig, out / "kv-usage.png")


def _save(plt: ModuleType, fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
