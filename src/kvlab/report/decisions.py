"""The labs' closing decisions, written from the measured rows with the figures behind them.

The offload lab's task 6 asks three questions (did the host tier pay, did the store pay, what
did the disk tier cost and save); the P/D lab asks which configuration you would actually use.
Each answer is one sentence carrying its figures and the settings it depends on, or "not
enough evidence" with the reason the rows do not decide it: a run that is missing or was not
run here, a cache that was never under pressure, two runs that are not the same experiment, a
split whose cache did not cross, a topology that was not recorded, or a difference whose 95%
interval spans 1 (`intervals.py`: no measurable difference). Rows without per-request files
have no interval: their point ratio decides as before (within 10% of 1 is no difference), and
the answer says "no interval: no per-request data". Where capacity searches were recorded,
the host tier's answer adds the most users at the target with the tier off and on, and the P/D
answer the baseline's and the split's request rate at the target. Read from the notebook and
the per-request files it names; nothing here measures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import mean
from typing import Literal

from kvlab.measure import (
    NOT_CROSSED,
    experiment_warnings,
    intervals,
    label_facts,
    load_rows,
    paired_rows,
    pressure,
)
from kvlab.records import (
    BASELINE,
    BOUNDARY,
    DISK,
    LLAMA_KV_QUANT,
    LLAMA_RAM_CURVE,
    LLAMA_RAM_ON,
    LLAMA_RAM_SMALL,
    LOOPBACK,
    MLX_CACHE,
    OFFLOAD_BOUNDARY,
    OFFLOAD_CURVE,
    PRESSURE_OFF,
    PRESSURE_ON,
    PROVEN,
    SHARED_SINGLE,
    SHARED_STORE,
    TWO_MACHINES,
    UNKNOWN,
    BoundaryRecord,
    ComparisonRecord,
    DiskRecord,
    LoadRecord,
    Notebook,
    NoteRecord,
    Record,
    ReuseRecord,
    capacity_label,
)
from kvlab.report import tier_curve
from kvlab.report.common import fixed_kv_bytes, latest, not_run, num
from kvlab.report.llama import QUANT_Q, quant_answer, ram_against_none, ram_words
from kvlab.report.offload import (
    capacity_line,
    capacity_words,
    memory_kind,
    summary,
    tier_against_none,
)
from kvlab.report.placement import Group, split_groups

NOT_ENOUGH = "Not enough evidence"
SAME_WITHIN = 0.10  # without an interval, a TTFT ratio within 10% of 1 is no difference


@dataclass(frozen=True)
class Decision:
    lab: str
    question: str
    answer: str
    decided: bool  # False: the rows do not decide it, and `answer` says why
    figure: str = ""  # the figure the answer rests on, short (a ratio and its interval)
    rows: tuple[str, ...] = ()  # the labels of the report rows behind it
    yours: str = ""  # the user's own answer (`kvlab note`), beside kvlab's draft

    def as_dict(self) -> dict[str, str | bool]:
        return {"lab": self.lab, "question": self.question, "answer": self.answer,
                "decided": self.decided, "figure": self.figure, "yours": self.yours}

    def extended(self, words: str) -> Decision:
        """The same decision with `words` said after its answer."""
        return replace(self, answer=f"{self.answer.rstrip('.')}. {words}.")


def _undecided(lab: str, question: str, why: str) -> Decision:
    return Decision(lab, question, f"{NOT_ENOUGH}: {why}.", False)


def _absent(book: Notebook, label: str, what: str) -> str:
    skipped = not_run(book, label)
    if skipped:
        return f"{what} was not run here ({skipped.reason})"
    return f"{what} is not in the notebook (no `{label}` line)"


def decide(book: Notebook) -> list[Decision]:
    """The offload lab's answers (the host tier, with llama.cpp's where it ran; the store;
    the disk tier; the quantised cache), then the P/D lab's one (with the capacities)."""
    tier = [(PRESSURE_OFF.label, "tier off"), (PRESSURE_ON.label, "tier on")]
    split = [(BASELINE.label, "baseline"), *((g.label, f"split `{g.label}`")
                                             for g in split_groups(book))]
    host = replace(host_tier(book), rows=(PRESSURE_ON.label, PRESSURE_OFF.label,
                                          PRESSURE_ON.label + "-smaller"))
    pd = configuration(book)
    pd = replace(pd, rows=(*pd.rows, BASELINE.label, *(g.label for g in split_groups(book))))
    drafted = [with_capacity(with_llama(with_smaller_tier(host, book), book), book, tier,
                             smaller_tier=False),
               replace(store(book), rows=(SHARED_STORE.label,)),
               replace(with_mlx(disk(book), book), rows=(DISK.label, MLX_CACHE.label)),
               quantised(book), tier_size(book), tier_length(book),
               with_capacity(pd, book, split)]
    return [with_yours(d, book) for d in drafted]



# ---------------------------------------------------------------- offload: the host tier

HOST_Q = "Did the host tier pay?"


def host_tier(book: Notebook) -> Decision:
    lab, records = "offload", book.records
    on_label, off_label = PRESSURE_ON.label, PRESSURE_OFF.label
    on, off = paired_rows(records, on_label, off_label)
    for rows, label, what in ((on, on_label, "the tier-on run under pressure"),
                              (off, off_label, "the tier-off run under pressure")):
        if not rows:
            return _undecided(lab, HOST_Q, _absent(book, label, what))
    shared = sorted(set(on) & set(off))
    if not shared:
        return _undecided(lab, HOST_Q, f"the two runs share no concurrency level (tier on "
                                        f"{sorted(on)}, off {sorted(off)})")
    facts_on = label_facts(records, on_label)
    facts_off = label_facts(records, off_label)
    differ = experiment_warnings(on_label, off_label, on, off, facts_on, facts_off)
    if differ:
        return _undecided(lab, HOST_Q, "the tier-on and tier-off runs are not the same "
                                       "experiment (" + "; ".join(d.strip() for d in differ) + ")")
    level = shared[-1]
    a, b = on[level], off[level]
    pressed, why = _pressure(records, b)
    if pressed is None:
        return _undecided(lab, HOST_Q, f"the pressure on the device cache was not recorded "
                                       f"({why})")
    if not pressed:
        return _undecided(lab, HOST_Q, f"the device cache was not under pressure without the "
                                       f"tier ({why}), so the tier had nothing to do; "
                                       f"{_settings(a, level)}")
    iv = intervals.ttft(book.path, records, a, b)
    found = _host_decision(a, b, level, why, iv)
    memory = memory_kind(book, a)  # the lab: on unified memory the tier may buy much less
    return found.extended(memory[0].upper() + memory[1:]) if memory else found


def with_smaller_tier(found: Decision, book: Notebook) -> Decision:
    """The answer with the run whose host tier was smaller than its working set, where one
    ran: another experiment than the tier that held it, said after it."""
    small = tier_against_none(book, smaller_tier=True)
    if small is None:
        return found
    on_s, off_s, pooled = _quoted(small.on, small.off, small.ttft)
    words = (f"With a tier smaller than the working set "
             f"({small.on.tier or 'size not recorded'}), TTFT p50 {num(on_s)} s "
             f"against {num(off_s)} s without{pooled} at concurrency {small.level}: "
             f"{small.ttft.cell()}")
    return found.extended(words)


def with_llama(found: Decision, book: Notebook) -> Decision:
    """The answer with llama.cpp's RAM cache against none, where it ran: it decides the
    question where vLLM's tier could not (a CPU build, no vLLM on this machine)."""
    words = ram_words(book)
    if words is None:
        return found
    rows = (*found.rows, LLAMA_RAM_ON.label, LLAMA_RAM_SMALL.label)
    if found.decided:
        return replace(found.extended(words), rows=rows)
    held = ram_against_none(book, LLAMA_RAM_ON.label)
    decided = held is not None and held.ttft.measured and held.ttft.spans_one is False
    figure = f"llama.cpp RAM cache: TTFT p50 {held.ttft.cell()}" if held is not None else ""
    return replace(found, answer=f"{words}. vLLM's tier: {found.answer}", decided=decided,
                   figure=figure if decided else found.figure, rows=rows)


TIER_SIZE_Q = "How much tier is worth having on this machine?"


def tier_size(book: Notebook) -> Decision:
    """The smallest measured tier that reached 90% of the best gain: vLLM's host tier where
    its sizes ran, else llama.cpp's RAM cache; with what vLLM's curve could not run."""
    tc = tier_curve
    rows = (OFFLOAD_CURVE.label, LLAMA_RAM_CURVE.label)
    host, ram = tc.points(book, tc.HOST), tc.points(book, tc.RAM)
    if any(p.size for p in host):
        words, figure = curve_answer(host, tc.HOST)
        if any(p.size for p in ram):
            words += f"; on llama.cpp's RAM cache, {curve_answer(ram, tc.RAM)[0]}"
        return Decision("offload", TIER_SIZE_Q, f"On vLLM's host tier, {words}", True,
                        figure, rows)
    unrun = host_unrun(book, host)
    if len(ram) < 2:
        why = _absent(book, LLAMA_RAM_CURVE.label, "a curve of tier sizes")
        return replace(_undecided("offload", TIER_SIZE_Q, why + (f"; {unrun}" if unrun
                                                                else "")), rows=rows)
    words, figure = curve_answer(ram, tc.RAM)
    return Decision("offload", TIER_SIZE_Q, f"On llama.cpp's RAM cache, {words}"
                    + (f". {unrun[0].upper()}{unrun[1:]}" if unrun else ""), True, figure, rows)


def curve_answer(found: list[tier_curve.CurvePoint], knob: tier_curve.Knob) -> tuple[str, str]:
    """A curve's answer, its cliff, and the figure it rests on."""
    words = tier_curve.answer(found, knob)
    if (step := tier_curve.cliff(found, knob)) is not None:
        words = f"{words}; {step}"
    best = tier_curve.best_point(found)
    figure = (f"{knob.size(best.size)}: TTFT p50 {best.ttft.cell()}" if best and best.ttft
              else "")
    return words, figure


def host_unrun(book: Notebook, host: list[tier_curve.CurvePoint]) -> str:
    """What vLLM's curve ran where its tier sizes could not ("": no such curve run)."""
    if not host:
        return ""
    reasons = tier_curve.not_run(book, tier_curve.HOST, host)
    oracle = tier_curve.oracle_words(tier_curve.oracle_line(host))
    return ("vLLM's host tier sizes were not run here"
            + (f" ({reasons[0]})" if reasons else "")
            + ": only its tier-off reference ran" + (f", and {oracle}" if oracle else ""))


LENGTH_Q = "Where does the host tier start paying, by context length?"


def tier_length(book: Notebook) -> Decision:
    """The opening length where vLLM's tier starts paying, beside the arithmetic."""
    from kvlab.report import tier_boundary as tb

    rows = (OFFLOAD_BOUNDARY.label,)
    found = tb.lengths(book)
    if not found:
        return replace(_undecided("offload", LENGTH_Q, _absent(
            book, OFFLOAD_BOUNDARY.label, "a sweep of opening lengths")), rows=rows)
    sums = tb.arithmetic(found)
    if not any(f.on for f in found):
        why = tb.unrun(book, found)
        return replace(_undecided("offload", LENGTH_Q, "only the tier-off side of the length "
                                  "sweep ran" + (f" ({why})" if why else "")
                                  + (f"; {sums}" if sums else "")), rows=rows)
    judged = tb.judgement(found)
    cells = ", ".join(f"{f.tokens:,}: {f.ttft.cell()}" for f in found if f.ttft is not None)
    answer = f"{judged.statement[0].upper()}{judged.statement[1:]}"
    figure = (f"{judged.crossing_tokens:,.0f} tokens" if judged.crossing_tokens is not None
              else judged.verdict)
    return Decision("offload", LENGTH_Q, f"{answer} (TTFT p50 against the tier off by "
                    f"opening, 95% intervals: {cells})" + (f"; {sums}" if sums else ""),
                    judged.verdict != "not-enough-evidence", figure, rows)


def quantised(book: Notebook) -> Decision:
    """llama.cpp's q8_0 cache against f16 in the same memory."""
    found = quant_answer(book)
    if found is None:
        return replace(_undecided("offload", QUANT_Q, _absent(
            book, LLAMA_KV_QUANT.label, "the quantised cache against f16")),
            rows=(LLAMA_KV_QUANT.label,))
    return Decision("offload", QUANT_Q, found[0], True, found[1], (LLAMA_KV_QUANT.label,))


def with_capacity(found: Decision, book: Notebook, sides: list[tuple[str, str]], *,
                  smaller_tier: bool | None = None) -> Decision:
    """The answer with each side's capacity at the target (or why it was not measured),
    where a search was recorded or recorded as not run (`capacity_words`' `smaller_tier`)."""
    said = [f"{name}: " + capacity_words(book, label, smaller_tier=smaller_tier)
            .removeprefix("capacity at the target: ")
            for label, name in sides
            if capacity_line(book, label, smaller_tier=smaller_tier) is not None
            or not_run(book, capacity_label(label)) is not None]
    if not said:
        return found
    return found.extended(f"Capacity at the target, {'; '.join(said)}")


def _host_decision(a: LoadRecord, b: LoadRecord, level: int, why: str,
                   iv: intervals.Interval) -> Decision:
    on_s, off_s, pooled = _quoted(a, b, iv)
    if on_s is None or off_s is None or not off_s:
        return _undecided("offload", HOST_Q, f"a TTFT p50 is missing from the rows at "
                                             f"concurrency {level}")
    r = iv.ratio if iv.measured and iv.ratio is not None else on_s / off_s
    figures = (f"TTFT p50 {num(on_s)} s with it against {num(off_s)} s without{pooled} (x{r:.2f}"
               + (f", {intervals.level_words(iv.confidence)} interval {iv.low:.2f} to "
                  f"{iv.high:.2f}" if iv.measured else "")
               + f") at concurrency {level}, with the cache under pressure ({why})")
    served = a.metric_deltas.get("external_prefix_cache_hits")
    recall = f"; the tier served {float(served):,.0f} prompt tokens" if served else ""
    tail = f"{recall}; {_settings(a, level)}" + ("" if iv.measured else f"; {iv.words}")
    if iv.spans_one:
        return _undecided("offload", HOST_Q, f"no measurable difference: {figures}{tail}")
    if iv.measured:
        verb = "paid" if r < 1 else "cost time"
    else:
        verb = ("paid" if r <= 1 - SAME_WITHIN else "cost time" if r >= 1 + SAME_WITHIN
                else "made no measurable difference (within 10%)")
    band = f" [{iv.low:.2f}, {iv.high:.2f}]" if iv.measured else " (no interval)"
    return Decision("offload", HOST_Q, f"The host tier {verb}: {figures}{tail}.", True,
                    f"TTFT p50 x{r:.2f}{band}, c={level}")


def _quoted(a: LoadRecord, b: LoadRecord, iv: intervals.Interval
            ) -> tuple[float | None, float | None, str]:
    """The two TTFT p50s quoted beside `iv`'s ratio: where it pooled repeats, the pooled
    ones (the newest rows' would not give its ratio), and the words that say so."""
    if iv.repeats is None or max(iv.repeats) < 2 or iv.values is None:
        return _p50(a), _p50(b), ""
    n_a, n_b = iv.repeats
    counts = f"{n_a} repeats" if n_a == n_b else f"{n_a} and {n_b} repeats"
    return iv.values[0], iv.values[1], f", each side pooled over its {counts}"


def _settings(row: LoadRecord, level: int) -> str:
    fixed = fixed_kv_bytes(row)
    fraction = row.memory_fraction
    size = (f"device KV cache fixed at {fixed:,} bytes" if fixed is not None
            else f"memory fraction {fraction}" if fraction is not None
            else "memory fraction not recorded")
    tier = row.tier or "tier size not recorded"
    return f"measured at concurrency {level}, {size}, tier {tier}"


def _pressure(records: list[Record], off: LoadRecord) -> tuple[bool | None, str]:
    """Was the cache under pressure without the tier, and the figure that says so (the one
    judgement `kvlab compare` and the report's pressure rows give: `measure/pressure.py`)."""
    judged = pressure.judge_pressure(records, off)
    return judged.state, judged.why


def _p50(row: LoadRecord) -> float | None:
    return row.ttft_s.p50 if row.ttft_s is not None else None


# ---------------------------------------------------------------- offload: the store

STORE_Q = "Did the store pay?"


def store(book: Notebook) -> Decision:
    lab = "offload"
    alt = latest(book, ReuseRecord, SHARED_STORE.label)
    if alt is None:
        return _undecided(lab, STORE_Q, _absent(book, SHARED_STORE.label, "the alternating run"))
    rows = alt.rows
    if len(alt.endpoints) < 2 or len(rows) < 2:
        return _undecided(lab, STORE_Q, "the shared-store line has one endpoint or one turn: "
                                        "no turn ran on the second instance")
    t1, t2 = rows[0].ttft_s, rows[1].ttft_s
    verdicts = alt.summary.later_turn_verdicts if alt.summary is not None else None
    if not verdicts:
        return _undecided(lab, STORE_Q, f"turn 2 on the second instance took {num(t2)} s "
                                        f"against turn 1's {num(t1)} s, but no per-turn cache "
                                        "evidence was recorded, so warm-up is not ruled out")
    store_kind = f"a {alt.connector} store" if alt.connector else "a store"
    cached = rows[1].cached_tokens
    head = (f"The store paid: turn 2 on the second instance took {num(t2)} s against turn 1's "
            f"{num(t1)} s on the first" + (f" ({cached:,} prompt tokens from the store)"
                                            if cached else "")
            if verdicts[0] == "reused" else
            f"The store did not pay: turn 2 on the second instance was judged {verdicts[0]} "
            f"({num(t2)} s against turn 1's {num(t1)} s)")
    return Decision(lab, STORE_Q, f"{head}, with {store_kind} shared by two instances; "
                                  f"{_control(book, alt)}.", True,
                    f"turn 2 {num(t2)} s against turn 1 {num(t1)} s")


def _control(book: Notebook, alt: ReuseRecord) -> str:
    single = latest(book, ReuseRecord, SHARED_SINGLE.label)
    if single is None:
        return ("whether the store adds latency of its own is not measured (no "
                f"{SHARED_SINGLE.label} control)")
    best_alt = summary(alt).best_later_ttft_s
    best_one = summary(single).best_later_ttft_s
    if not best_alt or not best_one:
        return "the single-instance control recorded no later-turn TTFT"
    spread = intervals.reuse_turns(book.records, alt, single)
    return (f"the best later turn took {num(best_alt)} s alternating against {num(best_one)} s "
            f"on one instance with the same store (x{best_alt / best_one:.2f})"
            + (f"; median later turn, alternating / one instance: {spread.cell()}"
               if spread.measured else ""))


# ---------------------------------------------------------------- offload: the disk tier

DISK_Q = "What did the disk tier cost, and what would it save?"


def disk(book: Notebook) -> Decision:
    lab = "offload"
    r = latest(book, DiskRecord, DISK.label)
    if r is None:
        return _undecided(lab, DISK_Q, _absent(book, DISK.label, "the disk tier"))
    if r.verdict != PROVEN:
        return _undecided(lab, DISK_Q, f"the restore was not shown to reuse the cache "
                                       f"({r.verdict}: "
                                       f"{'; '.join(r.reasons) or 'no reason'})")
    cold, after = r.cold_ttft_s, r.post_restore_ttft_s
    save, restore = r.save_ms, r.restore_ms
    if cold is None or after is None or save is None or restore is None:
        return _undecided(lab, DISK_Q, "the save, restore or cold-prefill time (or the prompt "
                                       "length) is missing from the disk line")
    size = r.file_bytes
    return Decision(lab, DISK_Q, (
        f"The disk tier cost {num(save, 1)} ms to save and {num(restore, 1)} ms to restore a "
        f"{r.prompt_tokens:,}-token slot"
        + (f" ({size:,} bytes on disk, KV {r.kv_cache_type})" if size else "")
        + f"; after the restore the first token took {num(after)} s against {num(cold)} s "
        f"from cold, saving {num(cold - after)} s each time the conversation comes back."),
        True, f"first token {num(after)} s after restore against {num(cold)} s cold")


def with_mlx(found: Decision, book: Notebook) -> Decision:
    """The disk answer with mlx-lm's prompt-cache file (the Apple track's fourth tier), where
    it ran; it decides the question where llama.cpp's slot file did not run."""
    r = latest(book, DiskRecord, MLX_CACHE.label)
    if r is None or r.cold_ttft_s is None or r.post_restore_ttft_s is None:
        return found
    words = (f"On mlx-lm, the prompt-cache file ({r.file_bytes or 0:,} bytes for "
             f"{r.prompt_tokens:,} tokens, {r.verdict}) loaded in {num(r.restore_ms, 1)} ms in a "
             f"new process, and its first token took {num(r.post_restore_ttft_s)} s against "
             f"{num(r.cold_ttft_s)} s from cold")
    if found.decided or r.verdict != PROVEN:
        return found.extended(words)
    return Decision("offload", DISK_Q, words + ".", True,
                    f"first token {num(r.post_restore_ttft_s)} s after load against "
                    f"{num(r.cold_ttft_s)} s cold")


# ---------------------------------------------------------------- P/D: which configuration

PD_Q = "Which configuration would you actually use?"


@dataclass(frozen=True)
class Judged:
    group: Group
    ttft: list[tuple[int, intervals.Interval]]  # (concurrency, split/baseline TTFT p50)
    problem: str = ""

    def mean_ratio(self) -> float:
        return mean(iv.ratio for _, iv in self.ttft if iv.ratio is not None)


def configuration(book: Notebook) -> Decision:
    lab = "pd"
    base = load_rows(book.records, BASELINE.label)
    if not base:
        return _undecided(lab, PD_Q, _absent(book, BASELINE.label, "the single-machine baseline"))
    judged = [_judge(book, g, paired_rows(book.records, g.label, BASELINE.label)[1])
              for g in split_groups(book)]  # each split against its own run's baseline
    if not judged:
        return _undecided(lab, PD_Q, "no split run is in the notebook, so there is nothing to "
                                     "choose against the baseline")
    valid = [j for j in judged if not j.problem]
    if not valid:
        return _undecided(lab, PD_Q, "; ".join(j.problem for j in judged))
    best = min(valid, key=Judged.mean_ratio)
    boundary = latest(book, BoundaryRecord, BOUNDARY.label)
    return _pd_decision(best, judged, boundary)


def _judge(book: Notebook, group: Group, base: dict[int, LoadRecord]) -> Judged:
    name = _name(group)
    c = group.comparison
    if group.topology == UNKNOWN:
        return Judged(group, [], f"{name}: its topology was not recorded, so which "
                                 "configuration it measured is unknown")
    if c is None:
        return Judged(group, [], f"{name} has no comparison against the baseline (kvlab "
                                 "compare)")
    if c.same_experiment is False:
        return Judged(group, [], f"{name} is not the same experiment as the baseline ("
                                 + "; ".join(c.differences) + ")")
    if c.bytes is not None and c.bytes.verdict == NOT_CROSSED:
        return Judged(group, [], f"{name}: the cache did not cross, decode prefilled by itself")
    ttft = _ttft(book, group, c, base)
    if not ttft:
        return Judged(group, [], f"{name}: its comparison has no TTFT at any level")
    return Judged(group, ttft)


def _ttft(book: Notebook, group: Group, c: ComparisonRecord,
          base: dict[int, LoadRecord]) -> list[tuple[int, intervals.Interval]]:
    """The split's TTFT p50 over the baseline's at each level the comparison paired: from the
    per-request files with an interval where both sides have them, else the recorded ratio."""
    mine = {r.concurrency: r for r in group.rows}
    recorded = dict(_ratios(c, "ttft"))
    out = []
    for level in sorted(recorded):
        if level in mine and level in base:
            found = intervals.ttft(book.path, book.records, mine[level], base[level])
        else:
            found = intervals.Interval("ttft_p50", recorded[level])
        if found.ratio is not None:
            out.append((level, found))
    return out


def _ratios(c: ComparisonRecord, key: Literal["ttft", "tpot"]) -> list[tuple[int, float]]:
    """The comparison's recorded p50 ratios, split over baseline, by level."""
    out = []
    for lv in c.levels:
        d, b = ((lv.ttft_p50_disagg_s, lv.ttft_p50_baseline_s) if key == "ttft"
                else (lv.tpot_p50_disagg_s, lv.tpot_p50_baseline_s))
        if d is not None and b:
            out.append((lv.concurrency, d / b))
    return out


def _name(group: Group) -> str:
    where = {LOOPBACK: "on one machine", TWO_MACHINES: "across two machines"}.get(
        group.topology, group.topology)
    return f"the split `{group.label}` ({where}, {group.connector} connector)"


def _side(iv: intervals.Interval) -> str:
    """faster, slower or same: by the interval where there is one, else by the point."""
    if iv.spans_one:
        return "same"
    if iv.measured:
        return "faster" if iv.high is not None and iv.high < 1 else "slower"
    return "faster" if iv.ratio is not None and iv.ratio < 1 else "slower"


def _figure(level: int, iv: intervals.Interval) -> str:
    if iv.low is None or iv.high is None:
        return f"c={level} x{iv.ratio:.2f}"
    return f"c={level} x{iv.ratio:.2f} [{iv.low:.2f}, {iv.high:.2f}]"


def _level(found: list[tuple[int, intervals.Interval]]) -> str:
    """The level the intervals were read at (95%, or a sequential run's)."""
    return intervals.level_words(max((iv.confidence for _, iv in found),
                                     default=intervals.CONFIDENCE))


def _pd_decision(best: Judged, judged: list[Judged],
                 boundary: BoundaryRecord | None) -> Decision:
    c = best.group.comparison
    assert c is not None
    ttft = ", ".join(_figure(lv, iv) for lv, iv in best.ttft)
    by_side: dict[str, list[int]] = {"faster": [], "slower": [], "same": []}
    for level, iv in best.ttft:
        by_side[_side(iv)].append(level)
    faster, slower, same = by_side["faster"], by_side["slower"], by_side["same"]
    levels = "/".join(map(str, same))
    alike = f" and no measurably different at c={levels}" if same else ""
    if not faster and not slower:
        return _undecided("pd", PD_Q, f"the best split measured, {_name(best.group)}, made no "
                                      f"measurable difference to first token at any level "
                                      f"({_level(best.ttft)} intervals span 1: {ttft})")
    if faster and not slower and not same:
        head = f"Use {_name(best.group)}: its TTFT p50 against the baseline was {ttft}"
    elif not faster:
        head = (f"Use one machine, no split: the best split measured, {_name(best.group)}, "
                + ("was slower to first token at every level" if not same else
                   f"was slower to first token at c={'/'.join(map(str, slower))}{alike}")
                + f" ({ttft})")
    else:
        head = (f"Route by concurrency: {_name(best.group)} was faster to first token at "
                f"c={'/'.join(map(str, faster))}"
                + (" and slower elsewhere" if slower and not same else
                   f", slower at c={'/'.join(map(str, slower))}" if slower else "")
                + f"{alike} ({ttft})")
    return Decision("pd", PD_Q, f"{head} ({'; '.join(_notes(best, judged, boundary))}).", True,
                    f"TTFT {ttft}" if len(ttft) < 80 else "", (best.group.label,))


def _notes(best: Judged, judged: list[Judged], boundary: BoundaryRecord | None) -> list[str]:
    c = best.group.comparison
    assert c is not None
    tpot = ", ".join(f"c={lv} x{r:.2f}" for lv, r in _ratios(c, "tpot")) or "not measured"
    notes = [f"TPOT {tpot}"]
    unmeasured = {iv.words for _, iv in best.ttft if not iv.measured}
    if unmeasured:
        notes.append("TTFT " + "; ".join(sorted(unmeasured)) + ", so the ratios are points")
    if best.group.topology == LOOPBACK:
        notes.append("measured on one machine, which moves no KV over a network: a "
                     "two-machine split is not measured here")
    if boundary is not None and boundary.statement:  # the lab's routing boundary
        notes.append(f"by prompt length: {boundary.statement}")
    skipped = [j.problem for j in judged if j.problem]
    if skipped:
        notes.append("not considered: " + "; ".join(skipped))
    return notes


# ---------------------------------------------------------------- the user's own answers

def with_yours(found: Decision, book: Notebook) -> Decision:
    """The decision with the user's newest own answer to its question (`kvlab note`)."""
    topics = {"host-tier": HOST_Q, "store": STORE_Q, "disk": DISK_Q, "quantised": QUANT_Q,
              "configuration": PD_Q}
    notes = [n for n in book.of(NoteRecord) if topics[n.about] == found.question]
    return replace(found, yours=notes[-1].text) if notes else found
