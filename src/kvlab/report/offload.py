"""The offload lab's six-row table: tiers off and on, quiet and under pressure, the shared
store, and llama.cpp's disk tier."""

from __future__ import annotations

from kvlab.records.notebook import Notebook
from kvlab.report.common import (
    Table,
    latest,
    load_rows,
    measured_on,
    missing,
    num,
    pct,
)

OFFLOAD_COLUMNS = ["Tier", "How it was measured", "Turn 1 TTFT (s)", "Best later turn TTFT (s)",
                   "Prefix cache hit rate", "Evidence", "Measured on"]


def offload_table(book: Notebook) -> Table:
    table = Table("Offload lab: what the tiers measured", OFFLOAD_COLUMNS)
    table.rows.append(_reuse_row(book, "None, quiet server", "six turns, one instance",
                                 "offload-off"))
    table.rows.append(_reuse_row(book, "Host memory, quiet server", "six turns, one instance",
                                 "offload-on"))
    table.rows.append(_pressure_row(book, "None, cache under pressure", "offload-off-load"))
    table.rows.append(_pressure_row(book, "Host memory, cache under pressure", "offload-on-load"))
    table.rows.append(_reuse_row(book, "Shared store, two instances", "six turns alternating",
                                 "shared-store"))
    table.rows.append(_disk_row(book))
    return table


def _reuse_row(book: Notebook, tier: str, how: str, label: str) -> list[str]:
    r = latest(book, "reuse", label)
    if r is None:
        return missing(tier, how, book, label, 5)
    s = r.get("summary") or {}
    rates = [v for v in (s.get("hit_rate") or {}).values() if v is not None]
    later = s.get("later_turn_verdicts") or []
    evidence = [f"{s.get('reused_turns', 0)}/{len(later)} later turns reused"]
    cached = [row.get("cached_tokens") for row in r.get("rows", [])]
    evidence.append("cached tokens per turn " + ", ".join(num(c) for c in cached))
    if len(r.get("endpoints", [])) > 1:
        evidence.append(f"turn 2 on the other instance: {later[0] if later else 'n/a'}")
        proof = latest(book, "proof", f"{label}-proof")
        if proof:
            evidence.append("proof: " + ", ".join(
                f"{k} {v}" for k, v in proof.get("verdicts", {}).items() if v))
    evidence.append(f"pressure: {(r.get('pressure') or {}).get('state', 'quiet')}")
    return [tier, how, num(s.get("turn1_ttft_s")), num(s.get("best_later_ttft_s")),
            " / ".join(pct(v) for v in rates) or "n/a", "; ".join(evidence),
            measured_on(book, r)]


def _pressure_row(book: Notebook, tier: str, label: str) -> list[str]:
    rows = load_rows(book, label)
    if not rows:
        return missing(tier, "load generator under pressure", book, label, 5)
    r = rows[-1]
    p = r.get("pressure") or {}
    planned, reached = p.get("planned") or {}, p.get("reached") or {}
    ttft = r.get("ttft_s") or {}
    evidence = [
        f"working set {planned.get('oversubscription', 'n/a')}x the device cache of "
        f"{planned.get('cache_tokens', 'n/a')} tokens ({planned.get('conversations')} "
        f"conversations, {r.get('prompt_set')})",
        f"prefix hit rate {pct(r.get('prefix_hit_rate'))} where "
        f"{pct(planned.get('reusable_fraction'))} of the prompt tokens were reusable had "
        "nothing been evicted",
        f"peak KV usage {pct(reached.get('peak_kv_cache_usage'))}",
        f"preemptions {num(reached.get('preemptions'))}",
        f"{r.get('ok', 'n/a')} ok / {r.get('failed', 0)} failed",
    ]
    deltas = r.get("metric_deltas") or {}
    recalled, prompt = deltas.get("external_prefix_cache_hits"), deltas.get("prompt_tokens")
    hit_cell = pct(r.get("prefix_hit_rate"))
    if recalled and prompt:
        share = float(recalled) / float(prompt)
        hit_cell += f" device + {pct(share)} recalled from the tier"
        evidence.insert(1, f"the tier served {float(recalled):,.0f} prompt tokens "
                           f"({float(recalled) * float(planned.get('bytes_per_token') or 0):,.0f}"
                           " bytes)")
    how = f"load generator at concurrency {r.get('concurrency')}, {r.get('requests')} requests"
    return [tier, how, f"p50 {num(ttft.get('p50'))} (load: no turn order)",
            f"n/a for a load run; p90 {num(ttft.get('p90'))}, p99 {num(ttft.get('p99'))}",
            hit_cell, "; ".join(evidence), measured_on(book, r)]


def _disk_row(book: Notebook) -> list[str]:
    tier, how = "Disk, llama.cpp slot save and restore", "save, erase, restore, timed"
    r = latest(book, "disk", "disk")
    if r is None:
        return missing(tier, how, book, "disk", 5)
    ev = r.get("evidence") or {}
    control = (ev.get("control") or {}).get("cache_n")
    evidence = [f"{r.get('verdict')}", f"save {num(r.get('save_ms'), 1)} ms, restore "
                f"{num(r.get('restore_ms'), 1)} ms ({num(r.get('restore_cold_ratio'), 5)}x of the "
                f"cold TTFT)", f"{r.get('file_bytes', 0):,} bytes on disk",
                f"restored cache_n {r.get('post_restore_cached_tokens')} of "
                f"{r.get('prompt_tokens')} tokens", f"control (no restore) cache_n {control}",
                f"KV {r.get('kv_cache_type')}"]
    return [tier, how, f"{num(r.get('cold_ttft_s'))} (cold)",
            f"{num(r.get('post_restore_ttft_s'))} (after restore)", "not applicable",
            "; ".join(evidence), measured_on(book, r)]
