"""The offload lab's own plots: TTFT per turn for each reuse run (the quiet tiers, the shared
store and its control); the host tier's size against the oracle's hit share; vLLM's host tier
and llama.cpp's RAM cache against their sizes (`tier_curve.py`); restore against cold prefill
for the disk tier; and device KV-cache usage over time under pressure, beside what the tier
moved.

The tier-off vs tier-on pair is drawn as every pair is (`plots_load.py`); the figure's setup
and saving are `plots_figure.py`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.measure import tier_sides
from kvlab.records import (
    DISK,
    PRESSURE_OFF,
    PRESSURE_ON,
    QUIET_OFF,
    QUIET_ON,
    SHARED_SINGLE,
    SHARED_STORE,
    DiskRecord,
    KvSamples,
    LoadRecord,
    Notebook,
    ReuseRecord,
)
from kvlab.report import tier_curve as curves
from kvlab.report.common import latest
from kvlab.report.plots_figure import (
    COLOURS,
    Plot,
    _pyplot,
    _save,
    _style,
    figure,
    gaps,
    legend,
    suptitle,
    title,
    ylabel,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

REUSE_LABELS = (QUIET_OFF.label, QUIET_ON.label, SHARED_STORE.label, SHARED_SINGLE.label)


def ttft_per_turn(book: Notebook, out: Path) -> Plot | None:
    runs = [(label, r) for label in REUSE_LABELS if (r := latest(book, ReuseRecord, label))]
    if not runs:
        return None
    plt = _pyplot()
    fig, (ax,) = figure(plt)
    answers = []
    for (label, r), colour in zip(runs, COLOURS * 2, strict=False):
        ttft = [row.ttft_s for row in r.rows]
        ax.plot([str(row.turn) for row in r.rows], gaps(ttft), _style(len(ttft)), label=label,
                color=colour)
        later = [t for t in ttft[1:] if t is not None]
        if ttft and ttft[0] and later:
            answers.append(f"{label}: fastest later turn {min(later) / ttft[0]:.2f}x of turn 1")
    question = "Did the later turns of a conversation start faster than the first?"
    ax.set(xlabel="turn", ylabel="TTFT (s)")
    title(ax, question)
    ax.set_ylim(bottom=0)
    legend(ax, cols=len(runs))
    return _save(plt, fig, out / "ttft-per-turn.png", question,
                 "; ".join(answers) or "no later turn answered")


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
    fig, (ax,) = figure(plt)
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
    ax.set(xlabel="host tier, in device caches", ylabel="prompt tokens cached (%)")
    title(ax, question)
    ax.set_ylim(0, 100)
    legend(ax, cols=2)
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
    fig, axes = figure(plt, "tall" if knob is tc.HOST else "column",
                       rows=2 if knob is tc.HOST else 1, sharex=True)
    ax = axes[0]
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
    ratio_axis(ax, [v for (_, iv) in sized for v in (iv.ratio, iv.low, iv.high)])
    ax.set(ylabel="TTFT p50, against none")
    if knob is not tc.HOST:  # the panel under it names the shared axis
        ax.set_xlabel(f"{knob.setting} ({knob.unit})")
    title(ax, question)
    legend(ax, handles=[*ax.get_legend_handles_labels()[0],
                        *turns.get_legend_handles_labels()[0]])
    if knob is tc.HOST:
        _share_panel(axes[1], book, found, line, knob)
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
    legend(ax, cols=1)


def _enough(points: list[tuple[int, float]], device: int) -> str:
    """The smallest replayed tier that reaches 90% of the oracle's largest gain."""
    base, best = points[0][1], max(s for _, s in points)
    if best <= base:
        return "no tier size raised the oracle's hit share: nothing came back after eviction"
    size = next(b for b, s in points if s - base >= 0.9 * (best - base))
    return (f"the oracle reaches 90% of its gain ({base:.1%} to {best:.1%} of prompt tokens "
            f"cached) with a tier of {size / device:g} device caches ({size:,} blocks)")


def disk(book: Notebook, out: Path) -> Plot | None:
    r = latest(book, DiskRecord, DISK.label)
    if r is None or r.cold_ttft_s is None:
        return None
    plt = _pyplot()
    fig, (ax,) = figure(plt)
    names = ["cold prefill", "restore", "TTFT after restore"]
    values = [r.cold_ttft_s * 1000, r.restore_ms or 0, (r.post_restore_ttft_s or 0) * 1000]
    bars = ax.bar(names, values, color=["#999999", COLOURS[0], COLOURS[2]])
    ax.bar_label(bars, labels=[f"{v:,.1f} ms" for v in values])  # small bars stay readable
    question = "Is restoring a slot from disk faster than prefilling it cold?"
    ax.set(ylabel="milliseconds")
    title(ax, f"{question}\n{r.prompt_tokens} tokens, {r.kv_cache_type} KV")
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
    fig, axes = figure(plt, "wide" if moved else "column", cols=2 if moved else 1)
    ax = axes[0]
    peaks = []
    for (label, samples), colour in zip(sampled, COLOURS, strict=False):
        usage = [v * 100 if v is not None else None for v in samples.kv_cache_usage_perc or []]
        times = samples.t_s[: len(usage)]
        ax.plot(times, gaps(usage), "-" if len(usage) > 1 else "o", label=label, color=colour)
        seen = [u for u in usage if u is not None]
        if seen:
            peaks.append(f"{label} peaked at {max(seen):.0f}%")
    question = "Was the device KV cache full while the load ran, and what did the tier move?"
    ax.set(xlabel="seconds into the run", ylabel="KV cache usage (%)", ylim=(0, 105))
    title(ax, "device KV cache usage")
    legend(ax)
    if moved:
        if traffic:
            _traffic_panel(axes[1], traffic, moved["tier size"])
        else:
            _tier_panel(axes[1], moved)
        peaks.append("the tier stored {:.2f} GB and read back {:.2f} GB (its size {:.2f} GB)"
                     .format(*(v / 1e9 for v in moved.values())))
    suptitle(fig, question)
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
    ax.set(xlabel="seconds into the run")
    ylabel(ax, "GB since the run began (vLLM's counters)")
    title(ax, "host tier traffic over time, tier on")
    ax.set_ylim(bottom=0)
    legend(ax, cols=3)


def _tier_panel(ax: Axes, moved: dict[str, float]) -> None:
    bars = ax.bar(list(moved), [v / 1e9 for v in moved.values()],
                  color=[COLOURS[0], COLOURS[2], "#999999"])
    ax.bar_label(bars, labels=[f"{v / 1e9:,.2f} GB" for v in moved.values()])
    ylabel(ax, "GB over the run (vLLM's counters)")
    title(ax, "host tier traffic, tier on")
    ax.set_ylim(0, max(moved.values()) / 1e9 * 1.15)


RATIO_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)


def ratio_axis(ax: Axes, values: list[float | None]) -> None:
    """A log y axis of ratios holding 1 and every value, ticked at 1-2-5 steps (decades
    only where those would crowd) and named as ratios; no minor tick is named."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    seen = [v for v in values if v is not None and v > 0] or [1.0]
    low, high = min(*seen, 1.0) / 1.3, max(*seen, 1.0) * 1.3
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    ticks = [t for t in RATIO_TICKS if low <= t <= high]
    if len(ticks) > 7:
        ticks = [t for t in ticks if t in (0.01, 0.1, 1, 10, 100)]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
