"""The report's plots (PNG, matplotlib's Agg backend), drawn from notebook records only.

- TTFT per turn for each reuse run (the quiet tiers, the shared store and its control);
- TTFT and TPOT p50 by concurrency for paired load runs (baseline vs split, tier off vs on);
- restore against cold prefill for the disk tier;
- KV-cache usage over time where a pressure run sampled it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.records.notebook import Notebook
from kvlab.report.common import latest, load_rows

REUSE_LABELS = ("offload-off", "offload-on", "shared-store", "shared-store-single")
LOAD_PAIRS = (("baseline", "disagg"), ("offload-off-load", "offload-on-load"),
              ("interference-parallel-4", "interference-parallel-1"))


def _pyplot() -> Any:
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
    return written


def ttft_per_turn(book: Notebook, out: Path) -> Path | None:
    runs = [(label, r) for label in REUSE_LABELS if (r := latest(book, "reuse", label))]
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in runs:
        turns = [row["turn"] for row in r["rows"]]
        ttft = [row.get("ttft_s") for row in r["rows"]]
        ax.plot(turns, ttft, marker="o", label=label)
    ax.set(xlabel="turn", ylabel="TTFT (s)", title="Time to first token per turn")
    ax.legend()
    return _save(plt, fig, out / "ttft-per-turn.png")


def by_concurrency(book: Notebook, out: Path, base: str, other: str) -> Path | None:
    series = {label: load_rows(book, label) for label in (base, other)}
    if not any(series.values()):
        return None
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
    for label, rows in series.items():
        if not rows:
            continue
        levels = [r["concurrency"] for r in rows]
        ax1.plot(levels, [r["ttft_s"].get("p50") for r in rows], marker="o", label=label)
        ax2.plot(levels, [(r.get("tpot_s") or {}).get("p50") for r in rows], marker="o",
                 label=label)
    ax1.set(xlabel="concurrency", ylabel="TTFT p50 (s)", title="TTFT p50")
    ax2.set(xlabel="concurrency", ylabel="TPOT p50 (s)", title="TPOT p50")
    ax1.legend()
    return _save(plt, fig, out / f"{base}-vs-{other}.png")


def disk(book: Notebook, out: Path) -> Path | None:
    r = latest(book, "disk", "disk")
    if r is None or r.get("cold_ttft_s") is None:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["cold prefill", "restore", "TTFT after restore"]
    values = [r["cold_ttft_s"] * 1000, r.get("restore_ms") or 0,
              (r.get("post_restore_ttft_s") or 0) * 1000]
    ax.bar(names, values, color=["#999999", "#2a7ab9", "#5aae61"])
    ax.set(ylabel="milliseconds", yscale="log",
           title=f"Disk tier: {r.get('prompt_tokens')} tokens, {r.get('kv_cache_type')} KV")
    return _save(plt, fig, out / "disk-restore-vs-cold.png")


def kv_usage(book: Notebook, out: Path) -> Path | None:
    sampled = [(label, rows[-1]["kv_usage_samples"])
               for label in ("offload-off-load", "offload-on-load")
               if (rows := load_rows(book, label)) and rows[-1].get("kv_usage_samples")]
    if not sampled:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, samples in sampled:
        usage = [v * 100 if v is not None else None for v in samples.get("kv_cache_usage_perc", [])]
        ax.plot(samples.get("t_s", [])[: len(usage)], usage, label=label)
    ax.set(xlabel="seconds into the run", ylabel="KV cache usage (%)", ylim=(0, 105),
           title="Device KV cache under pressure")
    ax.legend()
    return _save(plt, fig, out / "kv-usage.png")


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
