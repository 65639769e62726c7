"""The offload lab's decisions about the host tier: did it pay under pressure (with the run
whose tier was smaller than its working set, and llama.cpp's RAM cache against none where it
ran), how much tier is worth having on this machine, and from what context length it starts
paying. Each is one sentence with its figures, or "not enough evidence" and why.

It does not answer the store's, the disk tier's or the quantised cache's questions
(`decisions_tiers.py`), nor add the capacities or the user's own answer (`decisions.py`);
the rows and curves it reads are `offload.py`'s, `llama.py`'s, `tier_curve.py`'s and
`tier_boundary.py`'s. Nothing here measures.
"""

from __future__ import annotations

from dataclasses import replace

from kvlab.measure import (
    experiment_warnings,
    intervals,
    label_facts,
    paired_rows,
    pressure,
    tier_backends,
    tier_pair,
)
from kvlab.records import (
    LLAMA_RAM_CURVE,
    LLAMA_RAM_ON,
    LLAMA_RAM_SMALL,
    OFFLOAD_BOUNDARY,
    OFFLOAD_CURVE,
    PRESSURE_OFF,
    PRESSURE_ON,
    LoadRecord,
    Notebook,
    Record,
)
from kvlab.report import tier_curve, why_tier
from kvlab.report.common import (
    backend_called,
    crossing_words,
    fixed_kv_bytes,
    num,
    tier_held_by,
)
from kvlab.report.decisions_common import (
    SAME_WITHIN,
    Decision,
    Mark,
    Outcome,
    Panel,
    _absent,
    _undecided,
    first_clause,
)
from kvlab.report.llama import ram_against_none, ram_words
from kvlab.report.offload import memory_kind, tier_against_none, tier_verdict

HOST_Q = "Did the host tier pay?"


def host_tier(book: Notebook) -> Decision:
    """The tier under pressure against none; where more than one backend's tier ran (vLLM's
    own and LMCache's, KV_OFFLOAD_BACKEND), each judged against its own run's tier-off side,
    and which of them is worth having on this machine."""
    backends = tier_backends(book.records)
    if len(backends) < 2:
        return _host_tier(book, None)
    return which_backend(book, [(b, _host_tier(book, b)) for b in backends])


def which_backend(book: Notebook, judged: list[tuple[str, Decision]]) -> Decision:
    """One answer from each backend's: each one's sentence, then the one worth having (the
    one that paid, the better ratio where both did), or that neither paid here."""
    paid = [(b, d) for b, d in judged if d.outcome == "yes"]
    ratios = {b: d.chart[0].marks[0].value for b, d in judged if d.chart and d.chart[0].marks}
    best = min(paid, key=lambda bd: ratios.get(bd[0], 1.0))[0] if paid else None
    title = backend_called
    verdict = (f"On this machine the backend worth having is {title(best)}" if best else
               "Neither backend's tier paid on this machine") + " (TTFT p50 against none: " \
        + ", ".join(f"{title(b)} x{r:.2f}" for b, r in ratios.items()) + ")"
    answer = " ".join(f"{title(b)}: {d.answer}" for b, d in judged) + f" {verdict}."
    return Decision("offload", HOST_Q, answer, any(d.decided for _, d in judged),
                    "; ".join(f"{title(b)}: {d.figure}" for b, d in judged if d.figure),
                    headline=verdict, outcome="yes" if best else "no",
                    chart=(tier_panel(*(m for _, d in judged for p in d.chart
                                        for m in p.marks)),))


def _host_tier(book: Notebook, backend: str | None) -> Decision:
    lab, records = "offload", book.records
    on_label, off_label = PRESSURE_ON.label, PRESSURE_OFF.label
    on, off = tier_pair(records, backend=backend) if backend else \
        paired_rows(records, on_label, off_label)
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
    if not (iv.ratio is not None and iv.ratio < 1 and iv.spans_one is False) \
            and (cause := why_tier.cause(book, a, b, cost=iv.spans_one is False)):
        found = found.extended(cause.rstrip("."))  # it did not pay: why
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
    return found.extended(words).charted(
        tier_panel(Mark.of(f"smaller tier, c={small.level}", small.ttft)))


TIER_AXIS = "TTFT p50, tier / none"


def tier_panel(*marks: Mark | None) -> Panel:
    """The host tier's chart: each run's TTFT p50 against none."""
    return Panel("ratio", TIER_AXIS, tuple(m for m in marks if m is not None))


def with_llama(found: Decision, book: Notebook) -> Decision:
    """The answer with llama.cpp's RAM cache against none, where it ran: it decides the
    question where vLLM's tier could not (a CPU build, no vLLM on this machine)."""
    words = ram_words(book)
    if words is None:
        return found
    rows = (*found.rows, LLAMA_RAM_ON.label, LLAMA_RAM_SMALL.label)
    held = ram_against_none(book, LLAMA_RAM_ON.label)
    small = ram_against_none(book, LLAMA_RAM_SMALL.label)
    chart = tier_panel(*(Mark.of(name, pair.ttft) for name, pair in (
        ("llama.cpp RAM, all", held), ("llama.cpp RAM, a third", small)) if pair is not None))
    if found.decided:
        return replace(found.extended(words), rows=rows).charted(chart)
    decided = held is not None and held.ttft.measured and held.ttft.spans_one is False
    figure = f"llama.cpp RAM cache: TTFT p50 {held.ttft.cell()}" if held is not None else ""
    verdict = tier_verdict(held.ttft) if held is not None else None
    outcome: Outcome = "yes" if verdict == "paid" else "no"
    return replace(found, answer=f"{words}. vLLM's tier: {found.answer}", decided=decided,
                   figure=figure if decided else found.figure, rows=rows,
                   headline=first_clause(words) if decided else found.headline,
                   outcome=outcome).charted(chart)


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
        head, outcome = curve_headline(host, tc.HOST, "vLLM")
        return Decision("offload", TIER_SIZE_Q, f"On vLLM's host tier, {words}", True,
                        figure, rows, headline=head, outcome=outcome).charted(
            size_panel(host, tc.HOST), size_panel(ram, tc.RAM))
    unrun = host_unrun(book, host)
    if len(ram) < 2:
        why = _absent(book, LLAMA_RAM_CURVE.label, "a curve of tier sizes")
        return replace(_undecided("offload", TIER_SIZE_Q, why + (f"; {unrun}" if unrun
                                                                else "")), rows=rows)
    words, figure = curve_answer(ram, tc.RAM)
    head, outcome = curve_headline(ram, tc.RAM, "llama.cpp")
    return Decision("offload", TIER_SIZE_Q, f"On llama.cpp's RAM cache, {words}"
                    + (f". {unrun[0].upper()}{unrun[1:]}" if unrun else ""), True, figure, rows,
                    headline=head, outcome=outcome).charted(size_panel(ram, tc.RAM))


def curve_headline(found: list[tier_curve.CurvePoint], knob: tier_curve.Knob,
                   engine: str) -> tuple[str, Outcome]:
    """A curve's answer in one short sentence, and which way it came out."""
    best = tier_curve.best_point(found)
    if best is None or best.gain <= 0:
        return f"On {engine}, no {knob.tier} size paid", "no"
    enough = next(p for p in found if p.size and p.gain >= tier_curve.SHARE_OF_BEST * best.gain)
    return (f"On {engine}, {knob.size(enough.size)} of {knob.tier} was enough "
            f"(90% of the best gain)"), "yes"


def size_panel(found: list[tier_curve.CurvePoint], knob: tier_curve.Knob) -> Panel:
    """A curve's chart: each size's TTFT p50 against none."""
    return Panel("ratio", f"TTFT p50, {knob.tier} / none",
                 tuple(m for p in found if p.size and p.ttft is not None
                       and (m := Mark.of(knob.size(p.size), p.ttft)) is not None))


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
    words = crossing_words(judged.verdict)
    figure = (f"{judged.crossing_tokens:,.0f} tokens" if judged.crossing_tokens is not None
              else ", ".join(f"x{f.ttft.ratio:.2f} at {f.tokens:,}" for f in found
                             if f.ttft is not None and f.ttft.ratio is not None))
    outcome: Outcome = ("no" if judged.verdict == "pays-nowhere" else "choice"
                        if judged.verdict == "mixed" else "yes")
    panel = Panel("ratio", "TTFT p50, tier on / off, by opening", tuple(
        m for f in found if f.ttft is not None and (m := Mark.of(f"{f.tokens:,}", f.ttft))))
    return Decision("offload", LENGTH_Q, f"{answer} (TTFT p50 against the tier off by "
                    f"opening, 95% intervals: {cells})" + (f"; {sums}" if sums else ""),
                    judged.verdict != "not-enough-evidence", figure, rows,
                    headline=f"The host tier {words}" if judged.crossing_tokens is None
                    else first_clause(answer), outcome=outcome).charted(panel)



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
    held = tier_held_by(a.tier)  # LMCache's server, not vLLM's own tier
    tier = f"The host tier ({held}'s)" if held else "The host tier"
    chart = tier_panel(Mark(f"{held or 'vLLM'} tier, c={level}", r, iv.low, iv.high))
    if iv.spans_one:
        return _undecided("offload", HOST_Q, f"no measurable difference: {figures}{tail}"
                          ).charted(chart)
    if iv.measured:
        verb = "paid" if r < 1 else "cost time"
    else:
        verb = ("paid" if r <= 1 - SAME_WITHIN else "cost time" if r >= 1 + SAME_WITHIN
                else "made no measurable difference (within 10%)")
    band = f" [{iv.low:.2f}, {iv.high:.2f}]" if iv.measured else " (no interval)"
    return Decision("offload", HOST_Q, f"{tier} {verb}: {figures}{tail}.", True,
                    f"TTFT p50 x{r:.2f}{band}, c={level}", headline=first_clause(
                        f"{tier} {verb}"), outcome="yes" if verb == "paid" else "no",
                    chart=(chart,))


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
