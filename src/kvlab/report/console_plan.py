"""What `kvlab plan` prints: each simulated arm's figures, the highest rate and the fewest
replicas meeting the target, and what the model leaves out. The plan's own record only; nothing
here simulates or decides."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from kvlab.records import Percentiles, PlanRecord

SHOWN_REPLICAS = 2  # up to this many replicas, each one's figure; beyond, the range


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _s(p: Percentiles | None, field: str) -> str:
    value = getattr(p, field) if p is not None else None
    return "-" if value is None else f"{value:.3f}"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _spread(values: Sequence[float | None], text: Callable[[float | None], str]) -> str:
    """Each replica's figure, or their range when there are many."""
    shown = [v for v in values if v is not None]
    if len(values) <= SHOWN_REPLICAS or not shown:
        return " ".join(map(text, values)) or "-"
    return f"{text(min(shown))} .. {text(max(shown))}"


def plan_tables(console: Console, record: PlanRecord) -> None:
    """The plan's arms, its answers and what it leaves out."""
    p = record.profile
    console.print(f"==> Plan for {record.workload}")
    console.print(f"    replica: {p.device_blocks:,} blocks of {p.block_tokens} tokens, prefill "
                  f"{p.prefill_s_per_token * 1e3:.3g} ms/token, recall "
                  f"{p.recall_s_per_token * 1e3:.3g} ms/token, decode step "
                  f"{p.decode_step_s * 1e3:.3g} + {p.decode_step_per_seq_s * 1e3:.3g} x batch "
                  f"ms, {p.max_seqs} sequences")
    table = Table("policy", "N", "tier", "rate/s", "hit", "hit per replica",
                  "requests per replica", "TTFT p50", "p90", "p99", "TPOT p50", "p90")
    for a in record.points:
        table.add_row(a.policy, str(a.replicas), f"{a.tier_blocks:,}", f"{a.rate:.3g}",
                      _pct(a.hit_share) + ("" if not a.tier_share
                                           else f" ({_pct(a.tier_share)} tier)"),
                      _spread(a.hit_share_per_replica, _pct),
                      _spread([float(c) for c in a.requests_per_replica], _count),
                      _s(a.ttft_s, "p50"), _s(a.ttft_s, "p90"), _s(a.ttft_s, "p99"),
                      _s(a.tpot_s, "p50"), _s(a.tpot_s, "p90"))
    console.print(table)
    if record.highest_rates:
        rates = Table("policy", "N", "tier", "target", "highest rate/s", "TTFT p90 there",
                      "note", title="The highest rate meeting the target")
        for r in record.highest_rates:
            rates.add_row(r.policy, str(r.replicas), f"{r.tier_blocks:,}", r.target,
                          "-" if r.rate is None else f"{r.rate:.4g}", _s(r.ttft_s, "p90"),
                          r.why or "")
        console.print(rates)
    if record.fewest_replicas:
        fewest = Table("policy", "tier", "rate/s", "target", "fewest replicas",
                       "TTFT p90 there", "note", title="The fewest replicas meeting the target")
        for f in record.fewest_replicas:
            fewest.add_row(f.policy, f"{f.tier_blocks:,}", f"{f.rate:.4g}", f.target,
                           "-" if f.replicas is None else str(f.replicas), _s(f.ttft_s, "p90"),
                           f.why or "")
        console.print(fewest)
    console.print("    What the model leaves out:")
    for sentence in record.left_out:
        console.print(f"    - {sentence}")
