"""The scale page's plots, from `kvlab plan --out` lines (docs/scale.md gives the commands).

    python docs/scale/plots.py RUN_DIR docs/scale

RUN_DIR holds the plans: points-N*.jsonl (every policy and tier at N replicas),
points-long-*.jsonl (the same on the longer trace), hr*.jsonl (highest rates and, in hr256,
the fewest replicas) and curve-*.jsonl (TTFT p90 against the rate for one policy).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STYLE = {"round-robin": "o", "least-outstanding": "s", "prefix-affinity": "^",
         "conversation-affinity": "v", "vllm-router:cache_aware": "D"}


def lines(run: Path, pattern: str) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(run.glob(pattern))]


def save(fig: plt.Figure, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def by_policy(ax: plt.Axes, series: dict[tuple[str, int], list[tuple[int, float]]],
              scale: float = 1.0) -> None:
    """One line per (policy, tier) against the replicas: solid without a tier, dashed with."""
    for (policy, tier), xy in sorted(series.items()):
        xy.sort()
        ax.plot([x for x, _ in xy], [scale * y for _, y in xy], marker=STYLE[policy],
                linestyle="-" if tier == 0 else "--", label=f"{policy}, tier {tier}")


def finish(fig: plt.Figure, ax: plt.Axes, title: str, out: Path) -> None:
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    save(fig, out)


def hit_share(run: Path, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    series: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for plan in lines(run, "points-N*.jsonl"):
        for p in plan["points"]:
            series[(p["policy"], p["tier_blocks"])].append((p["replicas"], p["hit_share"]))
    by_policy(ax, series, 100)
    longer = [p for plan in lines(run, "points-long-*.jsonl") for p in plan["points"]]
    ax.scatter([p["replicas"] * 1.15 for p in longer], [100 * p["hit_share"] for p in longer],
               marker="x", color="black", label="4 copies of the trace (every arm)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("replicas (0.5 requests a second each)")
    ax.set_ylabel("prompt tokens from cache (%)")
    finish(fig, ax, "hit share: conversation trace, tier 0 (solid) and 65,536 blocks (dashed)",
           out / "hit-share-vs-replicas.png")


def highest_rate(run: Path, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    series: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for plan in lines(run, "hr*.jsonl"):
        for a in plan["highest_rates"]:
            if a.get("rate") is not None:
                series[(a["policy"], a["tier_blocks"])].append(
                    (a["replicas"], a["rate"] / a["replicas"]))
    by_policy(ax, series)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("replicas")
    ax.set_ylabel("highest rate / replica (req/s)")
    finish(fig, ax, "highest rate meeting TTFT p90 <= 3 s, per replica",
           out / "highest-rate-per-replica.png")


def curve(run: Path, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    series: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    policy = ""
    for plan in lines(run, "curve-*.jsonl"):
        for p in plan["points"]:
            policy = p["policy"]
            series[(p["replicas"], p["tier_blocks"])].append((p["rate"], p["ttft_s"]["p90"]))
    for (n, tier), xy in sorted(series.items()):
        xy.sort()
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o",
                linestyle="-" if tier == 0 else "--", label=f"{n} replicas, tier {tier}")
    ax.axhline(3, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("requests a second")
    ax.set_ylabel("TTFT p90 (s)")
    finish(fig, ax, f"TTFT p90 against the rate ({policy})", out / "ttft-p90-vs-rate.png")


def fewest(run: Path, out: Path) -> None:
    answers = [a for plan in lines(run, "hr256*.jsonl") for a in plan["fewest_replicas"]]
    if not answers:
        return
    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = [f"{a['policy']}\ntier {a['tier_blocks']}" for a in answers]
    values = [a.get("replicas") or 0 for a in answers]
    ax.barh(range(len(values)), values, color=["C0" if a["tier_blocks"] == 0 else "C1"
                                               for a in answers])
    for i, a in enumerate(answers):
        ax.text(values[i], i, f" {a.get('replicas') or 'not met'}", va="center", fontsize=7)
    ax.set_yticks(range(len(values)), labels, fontsize=6)
    ax.set_xlabel("fewest replicas")
    ax.set_title(f"fewest replicas meeting TTFT p90 <= 3 s at {answers[0]['rate']:g} req/s",
                 fontsize=9)
    save(fig, out / "fewest-replicas.png")


if __name__ == "__main__":
    run, out = Path(sys.argv[1]), Path(sys.argv[2])
    for plot in (hit_share, highest_rate, curve, fewest):
        plot(run, out)
