"""The offload lab's six-row table: tiers off and on, quiet and under pressure, the shared
store, and llama.cpp's disk tier. The tier-on row under pressure also carries its TTFT p50
against the tier-off row's, with the 95% interval from the per-request files
(`intervals.py`; a `--repeat auto` run's at its rule's level, the rule and why it stopped in
the evidence), or the point ratio and why there is no interval. A pressure row states
`measure/pressure.py`'s judgement of its run first (the one `kvlab compare` gives); a run
judged quiet shows no figures there. A pressure row run as user sessions also states the
returning turns and how many came back after eviction, the measured working set, the device
cache and the host tier against the working set it would have had to hold; and the capacity at the
latency target (`capacity` lines, `capacity_words`), or why it was not measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core import human_bytes
from kvlab.measure import (
    intervals,
    judge_pressure,
    preemptions,
    tier_holds,
    tier_pair,
    tier_too_small,
)
from kvlab.observe import hit_rate
from kvlab.records import (
    DISK,
    MLX_CACHE,
    PRESSURE_OFF,
    PRESSURE_ON,
    QUIET_OFF,
    QUIET_ON,
    SMALLER_ON,
    VLLM_DISK,
    CapacityProbe,
    CapacityRecord,
    Deltas,
    DiskRecord,
    HostTierUse,
    LoadRecord,
    Notebook,
    PressurePlanned,
    ProofRecord,
    ReuseRecord,
    Row,
    capacity_label,
)
from kvlab.report.common import (
    NO_FIGURE,
    Line,
    Table,
    latest,
    measured_on,
    missing,
    not_run,
    num,
    oracle_cell,
    oracle_words,
    pct,
    said,
    sequential_words,
    startup_of,
    tier_title,
)
from kvlab.report.stores import held_words, shown, turn2
from kvlab.report.turns import median_interval, p50, turns

OFFLOAD_COLUMNS = ["TTFT, first turn (s)", "TTFT, later turns (s)", "Prefix cache hit rate",
                   "Ratio"]
WIDTH = len(OFFLOAD_COLUMNS)
NO_SMALLER = ("not measured yet: no tier-on run with a tier smaller than the working set "
              "(`--tier-gb N`, N GiB below the working set)")


def offload_table(book: Notebook, more: Sequence[Line] = ()) -> Table:
    """The table, with `more` rows after the disk tier (llama.cpp's, `report/llama.py`)."""
    table = Table("Offload lab: what the tiers measured", "Tier", OFFLOAD_COLUMNS)
    table.lines.append(reuse_row(book, QUIET_OFF))
    table.lines.append(reuse_row(book, QUIET_ON))
    table.lines.append(_pressure_row(book, PRESSURE_OFF))
    for smaller in (False, True):
        line = _pressure_row(book, SMALLER_ON if smaller else PRESSURE_ON, smaller_tier=smaller)
        against = tier_against_none(book, smaller_tier=smaller)
        if against and not line.absent:
            line.cells[3] = f"{against.ttft.cell()} (TTFT p50 against the tier off, " \
                f"c={against.level})"
            line.verdict = tier_verdict(against.ttft) or line.verdict
            if rule := sequential_words(book.records, against.on, against.off.label):
                line.evidence.append(rule)
        table.lines.append(line)
    table.lines += [reuse_row(book, s.alternating, alternating=True) for s in shown(book)]
    table.lines.append(_disk_row(book))
    table.lines.append(_disk_row(book, VLLM_DISK))
    table.lines.append(_disk_row(book, MLX_CACHE))
    table.lines += more
    return table


def tier_verdict(iv: intervals.Interval) -> str | None:
    """One word for the tier's TTFT against none: by its interval, else None."""
    if iv.spans_one is None or iv.ratio is None:
        return None
    return "no difference" if iv.spans_one else "paid" if iv.ratio < 1 else "cost time"


@dataclass(frozen=True)
class Summary:
    """A reuse line's turns summed up: kvlab's own summary, or the figures the seed's
    measure-reuse.py prints from its line (`later` None: no per-turn verdicts)."""

    turn1_ttft_s: float | None
    best_later_ttft_s: float | None
    best_later_ratio: float | None
    later: Sequence[str] | None  # each later turn's verdict
    reused_turns: int
    hit_rate: dict[str, float | None]  # by endpoint


def summary(r: ReuseRecord) -> Summary:
    """`r`'s summary as it recorded one, else the seed's figures (`seed_summary`)."""
    s = r.summary
    if s is None:
        return seed_summary(r)
    return Summary(s.turn1_ttft_s, s.best_later_ttft_s, s.best_later_ratio,
                   s.later_turn_verdicts, s.reused_turns, s.hit_rate)


def reuse_row(book: Notebook, row: Row, *, alternating: bool = False) -> Line:
    r = latest(book, ReuseRecord, row.label)
    if r is None:
        return missing(row, book, WIDTH)
    s = summary(r)
    rates = [v for v in s.hit_rate.values() if v is not None]
    later = s.later
    evidence = [f"{s.reused_turns}/{len(later)} later turns reused" if later
                is not None else "later turns not judged one by one: a measure-reuse.py line "
                "records no cached tokens per turn"]
    cached = [turn.cached_tokens for turn in r.rows]
    if any(c is not None for c in cached):
        evidence.append("cached tokens per turn " + ", ".join(said(c, "not recorded")
                                                              for c in cached))
    if len(r.endpoints) > 1:
        evidence.append(f"turn 2 on the other instance: {turn2(r) if later else _turn2(r)}")
        evidence += [held] if (held := held_words(book, r)) else []
        proof = latest(book, ProofRecord, f"{row.label}-proof")
        if proof:
            evidence.append("proof: " + ", ".join(
                f"{k} {v}" for k, v in proof.verdicts.items() if v))
    state = r.pressure.state if r.pressure is not None else None
    evidence.append(f"pressure: {state or 'not recorded'}")
    if r.note and r.summary is None:  # the seed's --note: the user's own words
        evidence.append(f"note: {r.note}")
    how = f"{len(r.rows)} turns " + ("alternating between two instances" if alternating
                               else "of one conversation, one instance")
    ratio = (f"{num(s.best_later_ratio, 2)}x (fastest later turn / turn 1)"
             if s.best_later_ratio is not None else "n/a: no later turn")
    verdict = ("not judged" if later is None else
               f"reused {s.reused_turns}/{len(later)}" if s.reused_turns else "not reused")
    return Line(tier_title(row.title, r.tier), how, [said(s.turn1_ttft_s, "not recorded"),
                                 said(s.best_later_ttft_s, "no later turn answered")
                                 + (" (fastest)" if s.best_later_ttft_s is not None else ""),
                                 " / ".join(pct(v) for v in rates) or "not recorded", ratio],
                evidence, measured_on(book, r), verdict, row.command, anchor=row.label)


def seed_summary(r: ReuseRecord) -> Summary:
    """The figures the seed's measure-reuse.py prints, from its line (turn rows and
    counter deltas): it writes no summary and no per-turn verdicts."""
    ttfts = [turn.ttft_s for turn in r.rows]
    first = ttfts[0] if ttfts else None
    later = [t for t in ttfts[1:] if t is not None]
    best = min(later) if later else None
    return Summary(turn1_ttft_s=first, best_later_ttft_s=best,
                   best_later_ratio=round(best / first, 3) if best is not None and first
                   else None, later=None, reused_turns=0,
                   hit_rate={url: hit_rate(d) for url, d in r.metric_deltas.items()})


def _turn2(r: ReuseRecord) -> str:
    rows = r.rows
    if len(rows) < 2 or rows[1].ttft_s is None:
        return "not recorded"
    first = rows[0].ttft_s
    return f"TTFT {num(rows[1].ttft_s)} s against turn 1's " + (
        f"{num(first)} s" if first is not None else "(not recorded)")


def _pressure_row(book: Notebook, row: Row, *, smaller_tier: bool = False) -> Line:
    on, off = tier_pair(book.records, smaller_tier=smaller_tier)
    rows = on if row.side == "on" else off  # the two rows from one run
    if not rows:
        if smaller_tier and not not_run(book, row.label):
            return Line(row.title, row.how, [NO_SMALLER, *[NO_FIGURE] * (WIDTH - 1)],
                        verdict="not measured", command=SMALLER_ON.command, absent=True,
                        anchor=row.label + "-smaller")
        return missing(row, book, WIDTH)
    return pressure_line(book, row, rows[max(rows)], smaller_tier=smaller_tier)


def pressure_line(book: Notebook, row: Row, r: LoadRecord, *, smaller_tier: bool = False,
                  capacity: bool = True) -> Line:
    """A pressure row from its newest load line `r`: the judgement first, then what the run
    planned and reached, the tier's own counts, the oracle and (with `capacity`) the
    capacity at the target."""
    p = r.pressure
    planned = p.planned if p is not None else None
    reached = p.reached if p is not None else None
    rate = r.prefix_hit_rate
    hit = pct(rate) if rate is not None else "not recorded"
    reusable = planned.reusable_fraction if planned is not None else None
    peak = reached.peak_kv_cache_usage if reached is not None else None
    evidence = [
        _working_set(planned, r.prompt_set),
        f"prefix hit rate {hit}" + (f" where {pct(reusable)} of the prompt tokens were "
                                    "reusable had nothing been evicted"
                                    if reusable is not None else ""),
        "peak KV usage " + (pct(peak) if peak is not None else "not sampled"),
        f"preemptions {said(preemptions(r), 'not recorded')}",
        f"{said(r.ok, 'ok count not recorded')} ok / {r.failed or 0} failed",
    ]
    recalled, prompt = r.metric_deltas.get("external_prefix_cache_hits"), \
        r.metric_deltas.get("prompt_tokens")
    if recalled and prompt:
        hit += f" + {pct(float(recalled) / float(prompt))} from the tier"
        per_token = planned.bytes_per_token if planned is not None else None
        evidence.insert(1, f"the tier served {float(recalled):,.0f} prompt tokens"
                        + (f" ({float(recalled) * float(per_token):,.0f} bytes)" if per_token
                           else ""))
    hit = oracle_cell(r, hit) if rate is not None else hit
    engine_side = tier_transfers(r.metric_deltas)
    if engine_side:
        evidence.insert(1, engine_side)
    turnover = tier_turnover(r.metric_deltas, planned)
    if turnover:
        evidence.insert(2, turnover)
    held = host_tier_words(reached.host_tier if reached is not None else None)
    if held:
        evidence.insert(1, held)
    judged = judge_pressure(book.records, r)
    evidence.insert(0, f"{judged.words}: {judged.why}")
    evidence[2:2] = _sessions_evidence(r)
    fit = tier_fit(planned)
    if fit:
        evidence.append(fit)
    evidence += oracle_words(r)
    if capacity:
        evidence.append(capacity_words(book, row.label, smaller_tier=smaller_tier))
    if memory := memory_kind(book, r):
        evidence.append(memory)
    how, anchor = _how(r), row.label + ("-smaller" if smaller_tier else "")
    if judged.state is False:  # a quiet run is no answer to the pressure row's question
        quiet = "not under pressure: this run was quiet (see the details)"
        return Line(tier_title(row.title, r.tier), how, [quiet, NO_FIGURE, hit, NO_FIGURE],
                    evidence,
                    measured_on(book, r), "quiet", row.command, anchor=anchor)
    first, later = _turn_cells(book, r)
    versus = "the reference" if row.side == "off" else "no tier-off run to compare"
    return Line(tier_title(row.title, r.tier), how, [first, later, hit, versus], evidence,
                measured_on(book, r), judged.words, row.command, anchor=anchor)


def _turn_cells(book: Notebook, r: LoadRecord) -> tuple[str, str]:
    """TTFT p50 of the first turns and of the later ones, each with its interval, for a
    session run with per-request data; else the run's p50 over every request."""
    found = turns(book, r)
    if found is None:
        ttft = r.ttft_s
        return (f"p50 {said(ttft.p50 if ttft else None, 'not recorded')}, all requests",
                "no turns: a load run")
    return _median_cell(found.first), _median_cell(found.later)


def _median_cell(values: list[float]) -> str:
    mid = p50(values)
    if mid is None:
        return "none answered"
    iv = median_interval(values)
    band = f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else ""
    return f"p50 {mid:.3f}{band} ({len(values)})"


def memory_kind(book: Notebook, r: LoadRecord) -> str | None:
    """Which memory the run's engine had, from its startup line: on unified memory the host
    tier is the same memory as the device's, so it may buy much less."""
    start = startup_of(book, r)
    kind = start.memory_kind if start is not None else None
    if kind is None:
        return None
    if kind == "unified":
        return ("memory: unified (the host tier shares the device's memory, so recalling "
                "from it saves recompute, not capacity)")
    if kind == "none":
        return "memory: a CPU build (the device cache and the tier are the same RAM)"
    return f"memory: {kind}"


def tier_transfers(deltas: Deltas) -> str | None:
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


def tier_turnover(deltas: Deltas, planned: PressurePlanned | None) -> str | None:
    """What the tier stored against its size, and what it read back against what it stored:
    a tier that stores several times its size and reads little back evicted before anyone
    returned; reading back more than it stored means blocks were recalled more than once."""
    stored, loaded = deltas.get("offload_store_bytes"), deltas.get("offload_load_bytes")
    tier = planned.host_tier_bytes if planned is not None else None
    if not stored or loaded is None or not tier:
        return None
    filled = float(stored) / float(tier)
    back = float(loaded) / float(stored)
    size = (f"the tier stored {human_bytes(float(stored))} ({filled:.2f}x its "
            f"{human_bytes(float(tier))}) and read back {human_bytes(float(loaded))}")
    if back > 1:
        return size + f", {back:.1f}x what it stored: blocks were recalled more than once"
    return size + f", {back:.1%} of what it stored"


def host_tier_words(used: HostTierUse | None) -> str | None:
    """What a host tier held and moved, as the engine logged it (llama-server's RAM cache)."""
    if used is None:
        return None
    limit = human_bytes(float(used.limit_bytes)) if used.limit_bytes else "no stated limit"
    peak = human_bytes(float(used.peak_bytes)) if used.peak_bytes is not None else "?"
    return (f"the tier held at most {peak} of its {limit} ({said(used.peak_entries, '?')} "
            f"prompts); {used.stores} prompts left the slots for it and {used.loads} came "
            f"back ({used.source})")


@dataclass(frozen=True)
class TierAgainstNone:
    """A tier run's on and off rows at the highest level both ran, and TTFT p50's interval."""

    level: int
    on: LoadRecord
    off: LoadRecord
    ttft: intervals.Interval


def tier_against_none(book: Notebook, *, smaller_tier: bool = False) -> TierAgainstNone | None:
    return against_none(book, *tier_pair(book.records, smaller_tier=smaller_tier))


def against_none(book: Notebook, on: dict[int, LoadRecord],
                 off: dict[int, LoadRecord]) -> TierAgainstNone | None:
    """A tier's rows against its tier-off side at the highest level both ran (None: none)."""
    shared = sorted(set(on) & set(off))
    if not shared:
        return None
    level = shared[-1]
    return TierAgainstNone(level, on[level], off[level],
                           intervals.ttft(book.path, book.records, on[level], off[level]))


def _how(r: LoadRecord) -> str:
    work = r.workload
    if work is None or work.kind != "sessions":
        return f"load generator at concurrency {r.concurrency}, {r.requests} requests"
    think = work.think_time
    return (f"user sessions: {work.users} users, {work.turns} turns each, think "
            f"time {think.kind if think else None} "
            f"{said(think.mean_s if think else None, '?')} s, {r.requests} turns")


def _sessions_evidence(r: LoadRecord) -> list[str]:
    s = r.sessions
    if s is None:
        return []
    rate = s.returning_hit_rate
    return [f"{s.evicted_turns} of {s.returning_turns} returning turns came back "
            f"after eviction (cached tokens at least one {s.cache_block_tokens}-token "
            f"block below the previous turn's prompt), returning turns' hit rate "
            f"{pct(rate) if rate is not None else 'not recorded'}",
            f"measured working set {s.working_set_tokens:,} tokens (the peak "
            "of the live conversations' contexts)"]


def tier_fit(planned: PressurePlanned | None) -> str | None:
    """Whether the host tier could hold the working set, in words (`pressure.tier_holds`;
    None: no tier, or the plan does not say enough)."""
    holds = tier_holds(planned)
    if holds is None or planned is None or planned.host_tier_bytes is None:
        return None
    tier, per_token = float(planned.host_tier_bytes), float(planned.bytes_per_token)
    ws = planned.working_set_tokens
    sizes = (f"the host tier ({human_bytes(tier)}, {tier / per_token:,.0f} tokens) {{}} the "
             f"working set ({ws:,} tokens, {human_bytes(ws * per_token)})")
    if not holds:
        return sizes.format("was smaller than") + ": it could not hold every conversation " \
            "it would have had to bring back"
    return sizes.format("could hold")


def capacity_line(book: Notebook, label: str, *, smaller_tier: bool | None = None
                  ) -> CapacityRecord | None:
    """`<label>-capacity`'s newest capacity line. With `smaller_tier`, only a search whose
    host tier could (False) or could not (True) hold its working set counts: a capacity
    belongs to the tier size it was measured with."""
    return next((r for r in reversed(book.of(CapacityRecord))
                 if _capacity_of(r, label, smaller_tier)), None)


def _capacity_of(r: LoadRecord | CapacityRecord, label: str, smaller_tier: bool | None) -> bool:
    return r.label == capacity_label(label) and (smaller_tier is None
                                                 or tier_too_small(r) == smaller_tier)


def capacity_words(book: Notebook, label: str, *, smaller_tier: bool | None = None) -> str:
    """`capacity_line`'s capacity at the target, or why it was not measured."""
    found = capacity_line(book, label, smaller_tier=smaller_tier)
    if found is not None:
        return f"capacity at the target: {found.statement}"
    skipped = not_run(book, capacity_label(label))
    if skipped is not None:
        return f"capacity at the target: not run here ({skipped.reason})"
    probes = [r.capacity_probe for r in book.of(LoadRecord)
              if _capacity_of(r, label, smaller_tier) and r.capacity_probe is not None]
    if probes:  # a search cut short (a time limit) leaves its probes and no capacity line
        newest = probes[probes_start(probes):]
        loads = ", ".join(f"{p.load:g}" for p in newest)
        return (f"capacity at the target: the search did not finish (no capacity line); its "
                f"probes measured {newest[0].knob} {loads} (rows "
                f"{capacity_label(label)})")
    return "capacity at the target: not measured (kvlab run with a target, or kvlab load " \
           "--find-capacity)"


def probes_start(probes: list[CapacityProbe]) -> int:
    """Where the newest search begins among a label's probes (its step 0)."""
    starts = [i for i, p in enumerate(probes) if p.step == 0]
    return starts[-1] if starts else 0


def _working_set(planned: PressurePlanned | None, prompt_set: str | None) -> str:
    if planned is None:
        return ("pressure not planned: this row records no working set or device cache size "
                "(a manual `kvlab load`; `kvlab run offload` sizes the cache to be too small)")
    cache = planned.cache_tokens
    users = planned.users
    return (f"working set {planned.oversubscription}x the device cache"
            + (f" of {cache:,} tokens" if cache is not None else "")
            + (f" ({users} users' live conversations, {prompt_set})" if users else
               f" ({said(planned.conversations, 'an unrecorded number of')} conversations, "
               f"{prompt_set or 'prompt set not recorded'})"))


def _disk_row(book: Notebook, row: Row = DISK) -> Line:
    """A disk tier's stopwatch: llama.cpp's slot file (`disk`) or mlx-lm's prompt-cache file
    (`mlx-cache`, which has no control: its load is a new process's)."""
    r = latest(book, DiskRecord, row.label)
    if r is None:
        return missing(row, book, WIDTH)
    ev = r.evidence
    control = ev.control.cache_n if ev is not None and ev.control is not None else None
    size = r.file_bytes
    ratio = r.restore_cold_ratio
    steps = (f"save {_ms(r.save_ms)}, restore {_ms(r.restore_ms)} ("
             + (f"{num(ratio, 5)}x of the cold TTFT)" if ratio is not None
                else "no ratio to the cold TTFT recorded)")) if row is not VLLM_DISK else (
        "no save or restore call: the blocks are read back inside the restored TTFT")
    evidence = [f"{r.verdict}", steps,
                f"{size:,} bytes on disk" if size is not None else "file size not recorded",
                f"restored cache_n {said(r.post_restore_cached_tokens, 'not recorded')} "
                f"of {said(r.prompt_tokens, 'an unrecorded number of')} tokens",
                f"control (no restore) cache_n {said(control, 'not recorded')}"
                if row is DISK else f"{r.note or ''}".strip(),
                *(r.reasons if row is VLLM_DISK else ()),
                f"KV {r.kv_cache_type or 'the model dtype'}"]
    if ev is not None and ev.logprob_max_abs_diff is not None:
        evidence.append(f"first-token logprobs against the cold prefill: at most "
                        f"{ev.logprob_max_abs_diff:.2g} apart")
    after = r.post_restore_ttft_s
    ratio_cell = (f"{after / r.cold_ttft_s:.3f}x (after restore / cold)"
                  if after is not None and r.cold_ttft_s else "n/a")
    return Line(row.title, row.how, [f"{said(r.cold_ttft_s, 'not recorded')} (cold)",
                                     f"{said(after, 'not recorded')} (after restore)",
                                     "not applicable", ratio_cell],
                [e for e in evidence if e], measured_on(book, r), str(r.verdict),
                row.command, anchor=row.label)


def _ms(value: float | None) -> str:
    return f"{num(value, 1)} ms" if value is not None else "not recorded"
