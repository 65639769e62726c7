"""The offload lab's six-row table: tiers off and on, quiet and under pressure, the shared
store, and llama.cpp's disk tier. The tier-on row under pressure also carries its TTFT p50
against the tier-off row's, with the 95% interval from the per-request files
(`intervals.py`), or the point ratio and why there is no interval. A pressure row states
`report/pressure.py`'s judgement of its run first (the one `kvlab compare` gives); a run
judged quiet shows no figures there. A pressure row run as user sessions also states the
returning turns and how many came back after eviction, the measured working set, the device
cache and the host tier against the working set it would have had to hold; and the capacity at the
latency target (`capacity` lines, `capacity_words`), or why it was not measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvlab.core.sizes import human_bytes
from kvlab.observe.metrics import hit_rate
from kvlab.records.models import LoadRecord, Record
from kvlab.records.notebook import Notebook
from kvlab.report import compare, intervals
from kvlab.report.common import (
    Table,
    latest,
    measured_on,
    missing,
    not_run,
    num,
    pct,
    said,
)
from kvlab.report.pressure import judge as judge_pressure
from kvlab.report.pressure import tier_holds, tier_too_small

OFFLOAD_COLUMNS = ["Tier", "How it was measured", "Turn 1 TTFT (s)", "Best later turn TTFT (s)",
                   "Prefix cache hit rate", "Evidence", "Measured on"]
HOLDS = "Host memory, cache under pressure"
SMALLER = "Host memory smaller than the working set, under pressure"
NO_SMALLER = ("not measured yet: no tier-on run with a tier smaller than the working set "
              "(`kvlab run offload --part pressure --tier-gb N`, N GiB below the working set)")


def offload_table(book: Notebook) -> Table:
    table = Table("Offload lab: what the tiers measured", OFFLOAD_COLUMNS)
    table.rows.append(_reuse_row(book, "None, quiet server", "six turns, one instance",
                                 "offload-off"))
    table.rows.append(_reuse_row(book, "Host memory, quiet server", "six turns, one instance",
                                 "offload-on"))
    table.rows.append(_pressure_row(book, "None, cache under pressure", "offload-off-load"))
    for smaller in (False, True):
        table.rows.append(_pressure_row(book, SMALLER if smaller else HOLDS, compare.OFFLOAD_ON,
                                        smaller_tier=smaller))
        against = tier_against_none(book, smaller_tier=smaller)
        if against:
            table.rows[-1][5] += (f"; TTFT p50 against the tier off at c={against.level}: "
                                  f"{against.ttft.cell()}")
    table.rows.append(_reuse_row(book, "Shared store, two instances", "six turns alternating",
                                 "shared-store"))
    table.rows.append(_disk_row(book))
    return table


def _reuse_row(book: Notebook, tier: str, how: str, label: str) -> list[str]:
    r = latest(book, "reuse", label)
    if r is None:
        return missing(tier, how, book, label, 5)
    s = r.get("summary") or seed_summary(r)
    rates = [v for v in (s.get("hit_rate") or {}).values() if v is not None]
    later = s.get("later_turn_verdicts")
    evidence = [f"{s.get('reused_turns', 0)}/{len(later)} later turns reused" if later
                is not None else "later turns not judged one by one: a measure-reuse.py line "
                "records no cached tokens per turn"]
    if s.get("best_later_ratio") is not None:
        evidence.append(f"fastest later turn {num(s['best_later_ratio'])}x of turn 1")
    cached = [row.get("cached_tokens") for row in r.get("rows", [])]
    if any(c is not None for c in cached):
        evidence.append("cached tokens per turn " + ", ".join(said(c, "not recorded")
                                                              for c in cached))
    if len(r.get("endpoints", [])) > 1:
        turn2 = later[0] if later else _turn2(r)
        evidence.append(f"turn 2 on the other instance: {turn2}")
        proof = latest(book, "proof", f"{label}-proof")
        if proof:
            evidence.append("proof: " + ", ".join(
                f"{k} {v}" for k, v in proof.get("verdicts", {}).items() if v))
    state = (r.get("pressure") or {}).get("state")
    evidence.append(f"pressure: {state or 'not recorded'}")
    if r.get("note") and not r.get("summary"):  # the seed's --note: the user's own words
        evidence.append(f"note: {r.get('note')}")
    return [tier, how, said(s.get("turn1_ttft_s"), "not recorded"),
            said(s.get("best_later_ttft_s"), "not recorded (no later turn answered)"),
            " / ".join(pct(v) for v in rates) or "not recorded (no /metrics counters)",
            "; ".join(evidence), measured_on(book, r)]


def seed_summary(r: Record) -> dict[str, Any]:
    """The figures the seed's measure-reuse.py prints, from its line (turn rows and
    counter deltas): it writes no summary and no per-turn verdicts."""
    ttfts = [row.get("ttft_s") for row in r.get("rows") or []]
    first = ttfts[0] if ttfts else None
    later = [t for t in ttfts[1:] if t is not None]
    best = min(later) if later else None
    return {"turn1_ttft_s": first, "best_later_ttft_s": best,
            "best_later_ratio": round(best / first, 3) if best is not None and first else None,
            "later_turn_verdicts": None,
            "hit_rate": {url: hit_rate(d) for url, d in (r.get("metric_deltas") or {}).items()
                         if isinstance(d, dict)}}


def _turn2(r: Record) -> str:
    rows = r.get("rows") or []
    if len(rows) < 2 or rows[1].get("ttft_s") is None:
        return "not recorded"
    first = rows[0].get("ttft_s")
    return f"TTFT {num(rows[1]['ttft_s'])} s against turn 1's " + (
        f"{num(first)} s" if first is not None else "(not recorded)")


def _pressure_row(book: Notebook, tier: str, label: str, *,
                  smaller_tier: bool = False) -> list[str]:
    on, off = compare.tier_pair(book.records, smaller_tier=smaller_tier)
    rows = on if label == compare.OFFLOAD_ON else off  # the two rows from one run
    if not rows:
        if smaller_tier and not not_run(book, label):
            return [tier, "load generator under pressure", NO_SMALLER,
                    *(["not measured yet"] * 4)]
        return missing(tier, "load generator under pressure", book, label, 5)
    r = rows[max(rows)]
    p = r.get("pressure") or {}
    planned, reached = p.get("planned") or {}, p.get("reached") or {}
    ttft = r.get("ttft_s") or {}
    rate = r.get("prefix_hit_rate")
    hit = pct(rate) if rate is not None else "not recorded (no /metrics counters)"
    preemptions = reached.get("preemptions", r.metric_deltas.get("preemptions"))
    evidence = [
        _working_set(planned, r.prompt_set),
        f"prefix hit rate {hit}" + (f" where {pct(planned['reusable_fraction'])} of the prompt "
                                    "tokens were reusable had nothing been evicted"
                                    if planned.get("reusable_fraction") is not None else ""),
        "peak KV usage " + (pct(reached["peak_kv_cache_usage"])
                            if reached.get("peak_kv_cache_usage") is not None
                            else "not sampled"),
        f"preemptions {said(preemptions, 'not recorded')}",
        f"{said(r.ok, 'ok count not recorded')} ok / {r.failed or 0} failed",
    ]
    recalled, prompt = r.metric_deltas.get("external_prefix_cache_hits"), \
        r.metric_deltas.get("prompt_tokens")
    if recalled and prompt:
        hit += f" device + {pct(float(recalled) / float(prompt))} recalled from the tier"
        per_token = planned.get("bytes_per_token")
        evidence.insert(1, f"the tier served {float(recalled):,.0f} prompt tokens"
                        + (f" ({float(recalled) * float(per_token):,.0f} bytes)" if per_token
                           else ""))
    engine_side = tier_transfers(r.metric_deltas)
    if engine_side:
        evidence.insert(1, engine_side)
    turnover = tier_turnover(r.metric_deltas, planned)
    if turnover:
        evidence.insert(2, turnover)
    judged = judge_pressure(book.records, r)
    evidence.insert(0, f"{judged.words}: {judged.why}")
    evidence[2:2] = _sessions_evidence(r)
    fit = tier_fit(planned)
    if fit:
        evidence.append(fit)
    evidence.append(capacity_words(book, label, smaller_tier=smaller_tier))
    how = _how(r)
    if judged.state is False:  # a quiet run is no answer to the pressure row's question
        quiet = (f"not measured under pressure: this run was quiet ({judged.why}); the row "
                 "needs a run whose cache was (`kvlab run offload --part pressure`)")
        return [tier, how, quiet, quiet, hit, "; ".join(evidence), measured_on(book, r)]
    return [tier, how, f"p50 {num(ttft.get('p50'))} (load: no turn order)",
            f"not applicable to a load run; p90 {said(ttft.get('p90'), 'not recorded')}, "
            f"p99 {said(ttft.get('p99'), 'not recorded')}",
            hit, "; ".join(evidence), measured_on(book, r)]


def tier_transfers(deltas: dict[str, Any]) -> str | None:
    """The tier's transfers as vLLM counted them: bytes and seconds each way, and the rate
    (None when this vLLM exported no offload counters)."""
    parts = []
    for way, words in (("load", "read back to the device"), ("store", "written to host memory")):
        moved, seconds = deltas.get(f"offload_{way}_bytes"), deltas.get(f"offload_{way}_s")
        if moved is None:
            continue
        rate = (f", {float(moved) / float(seconds) / 1e9:.1f} GB/s" if seconds else "")
        parts.append(f"{float(moved):,.0f} bytes {words}"
                     + (f" in {float(seconds):.3f} s{rate}" if seconds is not None else ""))
    return "vLLM's own count: " + "; ".join(parts) if parts else None


def tier_turnover(deltas: dict[str, Any], planned: dict[str, Any]) -> str | None:
    """How many times over the tier filled, and what share of it came back: a tier that takes
    in several times its size and gives little back evicted before anyone returned."""
    stored, loaded = deltas.get("offload_store_bytes"), deltas.get("offload_load_bytes")
    tier = planned.get("host_tier_bytes")
    if not stored or loaded is None or not tier:
        return None
    return (f"the tier took in {float(stored) / float(tier):.1f}x its own size "
            f"({human_bytes(float(stored))} into {human_bytes(float(tier))}) and gave back "
            f"{float(loaded) / float(stored):.1%} of what it took")


@dataclass(frozen=True)
class TierAgainstNone:
    """A tier run's on and off rows at the highest level both ran, and TTFT p50's interval."""

    level: int
    on: LoadRecord
    off: LoadRecord
    ttft: intervals.Interval


def tier_against_none(book: Notebook, *, smaller_tier: bool = False) -> TierAgainstNone | None:
    on, off = compare.tier_pair(book.records, smaller_tier=smaller_tier)
    shared = sorted(set(on) & set(off))
    if not shared:
        return None
    level = shared[-1]
    return TierAgainstNone(level, on[level], off[level],
                           intervals.ttft(book.path, book.records, on[level], off[level]))


def _how(r: Record) -> str:
    work = r.get("workload") or {}
    if work.get("kind") != "sessions":
        return f"load generator at concurrency {r.get('concurrency')}, {r.get('requests')} requests"
    think = work.get("think_time") or {}
    return (f"user sessions: {work.get('users')} users, {work.get('turns')} turns each, think "
            f"time {think.get('kind')} {said(think.get('mean_s'), '?')} s, "
            f"{r.get('requests')} turns")


def _sessions_evidence(r: Record) -> list[str]:
    s = r.get("sessions") or {}
    if not s:
        return []
    rate = s.get("returning_hit_rate")
    return [f"{s.get('evicted_turns')} of {s.get('returning_turns')} returning turns came back "
            f"after eviction (cached tokens at least one {s.get('cache_block_tokens')}-token "
            f"block below the previous turn's prompt), returning turns' hit rate "
            f"{pct(rate) if rate is not None else 'not recorded'}",
            f"measured working set {int(s.get('working_set_tokens') or 0):,} tokens (the peak "
            "of the live conversations' contexts)"]


def tier_fit(planned: dict[str, Any]) -> str | None:
    """Whether the host tier could hold the working set, in words (`pressure.tier_holds`;
    None: no tier, or the plan does not say enough)."""
    holds = tier_holds(planned)
    if holds is None:
        return None
    tier, per_token = float(planned["host_tier_bytes"]), float(planned["bytes_per_token"])
    ws = int(planned["working_set_tokens"])
    sizes = (f"the host tier ({human_bytes(tier)}, {tier / per_token:,.0f} tokens) {{}} the "
             f"working set ({ws:,} tokens, {human_bytes(ws * per_token)})")
    if not holds:
        return sizes.format("was smaller than") + ": it could not hold every conversation " \
            "it would have had to bring back"
    return sizes.format("could hold")


def capacity_line(book: Notebook, label: str, *, smaller_tier: bool | None = None
                  ) -> Record | None:
    """`<label>-capacity`'s newest capacity line. With `smaller_tier`, only a search whose
    host tier could (False) or could not (True) hold its working set counts: a capacity
    belongs to the tier size it was measured with."""
    return next((r for r in reversed(book.records) if r.record == "capacity"
                 and _capacity_of(r, label, smaller_tier)), None)


def _capacity_of(r: Record, label: str, smaller_tier: bool | None) -> bool:
    return r.label == f"{label}-capacity" and (smaller_tier is None
                                               or tier_too_small(r) == smaller_tier)


def capacity_words(book: Notebook, label: str, *, smaller_tier: bool | None = None) -> str:
    """`capacity_line`'s capacity at the target, or why it was not measured."""
    found = capacity_line(book, label, smaller_tier=smaller_tier)
    if found is not None:
        return f"capacity at the target: {found.get('statement')}"
    skipped = not_run(book, f"{label}-capacity")
    if skipped is not None:
        return f"capacity at the target: not run here ({skipped.reason})"
    probes = [r.get("capacity_probe") for r in book.records
              if r.record == "load" and _capacity_of(r, label, smaller_tier)
              and r.get("capacity_probe")]
    if probes:  # a search cut short (a time limit) leaves its probes and no capacity line
        newest = probes[probes_start(probes):]
        loads = ", ".join(f"{float(p.get('load') or 0):g}" for p in newest)
        return (f"capacity at the target: the search did not finish (no capacity line); its "
                f"probes measured {newest[0].get('knob', 'load')} {loads} (rows "
                f"{label}-capacity)")
    return "capacity at the target: not measured (kvlab run with a target, or kvlab load " \
           "--find-capacity)"


def probes_start(probes: list[dict[str, Any]]) -> int:
    """Where the newest search begins among a label's probes (its step 0)."""
    starts = [i for i, p in enumerate(probes) if p.get("step") == 0]
    return starts[-1] if starts else 0


def _working_set(planned: dict[str, Any], prompt_set: str | None) -> str:
    if planned.get("oversubscription") is None:
        return ("pressure not planned: this row records no working set or device cache size "
                "(a manual `kvlab load`; `kvlab run offload` sizes the cache to be too small)")
    cache = planned.get("cache_tokens")
    conversations = planned.get("conversations")
    users = planned.get("users")
    return (f"working set {planned['oversubscription']}x the device cache"
            + (f" of {int(cache):,} tokens" if cache is not None else "")
            + (f" ({users} users' live conversations, {prompt_set})" if users else
               f" ({said(conversations, 'an unrecorded number of')} conversations, "
               f"{prompt_set or 'prompt set not recorded'})"))


def _disk_row(book: Notebook) -> list[str]:
    tier, how = "Disk, llama.cpp slot save and restore", "save, erase, restore, timed"
    r = latest(book, "disk", "disk")
    if r is None:
        return missing(tier, how, book, "disk", 5)
    ev = r.get("evidence") or {}
    control = (ev.get("control") or {}).get("cache_n")
    size = r.get("file_bytes")
    ratio = r.get("restore_cold_ratio")
    evidence = [f"{r.get('verdict')}", f"save {_ms(r.get('save_ms'))}, restore "
                f"{_ms(r.get('restore_ms'))} ("
                + (f"{num(ratio, 5)}x of the cold TTFT)" if ratio is not None
                   else "no ratio to the cold TTFT recorded)"),
                f"{size:,} bytes on disk" if size is not None else "file size not recorded",
                f"restored cache_n {said(r.get('post_restore_cached_tokens'), 'not recorded')} "
                f"of {said(r.get('prompt_tokens'), 'an unrecorded number of')} tokens",
                f"control (no restore) cache_n {said(control, 'not recorded')}",
                f"KV {r.get('kv_cache_type') or 'cache type not recorded'}"]
    return [tier, how, f"{said(r.get('cold_ttft_s'), 'not recorded')} (cold)",
            f"{said(r.get('post_restore_ttft_s'), 'not recorded')} (after restore)",
            "not applicable", "; ".join(evidence), measured_on(book, r)]


def _ms(value: Any) -> str:
    return f"{num(value, 1)} ms" if value is not None else "not recorded"
