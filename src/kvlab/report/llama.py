"""The offload lab's llama.cpp rows (`kvlab run llama-tiers`), in the offload table's columns:
prompt caching off and on across turns; the RAM cache (llama.cpp's host tier) under pressure,
none, holding every conversation, and a third of that, each tier row with its TTFT p50
against the no-cache row of the same run and the interval from the per-request files; and
q8_0 KV against f16 in the same memory."""

from __future__ import annotations

from kvlab.core import human_bytes
from kvlab.measure import paired_rows
from kvlab.records import (
    LLAMA_KV_QUANT,
    LLAMA_PROMPT_OFF,
    LLAMA_PROMPT_ON,
    LLAMA_RAM_OFF,
    LLAMA_RAM_ON,
    LLAMA_RAM_SMALL,
    MLX_TURNS,
    SHARED_SLOTS,
    KvQuantRecord,
    LoadRecord,
    Notebook,
    ReuseRecord,
)
from kvlab.report.common import NO_FIGURE, Line, latest, measured_on, missing, said
from kvlab.report.offload import (
    WIDTH,
    TierAgainstNone,
    against_none,
    pressure_line,
    reuse_row,
    tier_verdict,
)


def llama_lines(book: Notebook) -> list[Line]:
    """The llama.cpp rows, in the lab's order (task 2, task 3, the quantised cache, then a slot
    file moved between two servers: the nearest llama.cpp comes to a shared store)."""
    lines = [reuse_row(book, LLAMA_PROMPT_OFF), reuse_row(book, LLAMA_PROMPT_ON)]
    for row in (LLAMA_RAM_OFF, LLAMA_RAM_ON, LLAMA_RAM_SMALL):
        on, _ = paired_rows(book.records, row.label, LLAMA_RAM_OFF.label)
        if not on:
            lines.append(missing(row, book, WIDTH))
            continue
        r = on[max(on)]
        line = pressure_line(book, row, r, capacity=False)
        against = ram_against_none(book, row.label)
        if against is not None and not line.absent:  # the off row is the reference
            line.cells[3] = f"{against.ttft.cell()} (TTFT p50 against no RAM cache)"
            line.verdict = tier_verdict(against.ttft) or line.verdict
        lines.append(line)
    lines.append(quant_line(book))
    lines.append(slots_line(book))
    lines.append(reuse_row(book, MLX_TURNS))  # mlx-lm's own cache across turns
    return lines


def slots_line(book: Notebook) -> Line:
    """A slot saved on one llama-server and restored on another (`kvlab run shared-slots`)."""
    r = latest(book, ReuseRecord, SHARED_SLOTS.label)
    ev = r.evidence if r is not None else None
    if r is None or ev is None:
        return missing(SHARED_SLOTS, book, WIDTH)
    cold, restored, control = ev.cold_a, ev.restored_b, ev.cold_b_control
    first = said(cold.ttft_s if cold else None, "not recorded")
    after = said(restored.ttft_s if restored else None, "not recorded")
    cached = (f"{restored.cache_n:,} of {restored.cache_n + (restored.prompt_n or 0):,} "
              "prompt tokens" if restored and restored.cache_n is not None else "not recorded")
    ratio = (f"{restored.ttft_s / cold.ttft_s:.3f}x (restored on B / cold on A)"
             if restored and cold and restored.ttft_s and cold.ttft_s else NO_FIGURE)
    evidence = [*r.reasons,
                f"the control (same prompt cold on B's other slot): TTFT "
                f"{said(control.ttft_s if control else None, 'not recorded')} s, cached "
                f"{said(control.cache_n if control else None, '?')} tokens",
                f"restored logprobs differ by at most {said(ev.logprob_max_abs_diff, '?')} "
                f"(tolerance {said(ev.logprob_tolerance, '?')})"]
    if ev.save is not None:
        evidence.append(f"slot file {said(ev.save.n_bytes, '?')} bytes for "
                        f"{ev.save.n_tokens:,} tokens")
    return Line(SHARED_SLOTS.title, SHARED_SLOTS.how, [f"{first} (cold on A)",
                                                       f"{after} (restored on B)", cached, ratio],
                evidence, measured_on(book, r), r.verdict or "not judged",
                SHARED_SLOTS.command, anchor=SHARED_SLOTS.label)


def ram_against_none(book: Notebook, label: str) -> TierAgainstNone | None:
    """`label`'s newest row against the no-cache row of the same run (None: no such pair)."""
    if label == LLAMA_RAM_OFF.label:
        return None
    return against_none(book, *paired_rows(book.records, label, LLAMA_RAM_OFF.label))


def quant_line(book: Notebook) -> Line:
    """q8_0 against f16 in the same memory: tokens that fit, TTFT, the logprob distance."""
    r = latest(book, KvQuantRecord, LLAMA_KV_QUANT.label)
    if r is None:
        return missing(LLAMA_KV_QUANT, book, WIDTH)
    ref, cand = r.reference, r.candidate
    memory = human_bytes(float(r.memory_bytes)) if r.memory_bytes else "?"
    ratio = r.ttft_p50
    shown = (f"{ratio.ratio:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]" if ratio and
             ratio.ratio is not None and ratio.low is not None and ratio.high is not None
             else ratio.words if ratio and ratio.words else None)
    cell = f"{shown} (TTFT p50 {cand.kv_type} / {ref.kv_type})" if shown else NO_FIGURE
    evidence = [
        f"in {memory} of KV: {ref.kv_type} {said(ref.kv_cache_tokens, '?')} tokens, "
        f"{cand.kv_type} {said(cand.kv_cache_tokens, '?')} "
        f"({said(r.tokens_ratio, '?')}x the tokens), from each server's startup line",
        f"a {said(r.long_prompt_tokens, '?')}-token prompt: {ref.kv_type} {ref.long_prompt}; "
        f"{cand.kv_type} {cand.long_prompt}",
        f"TTFT p50 {ref.kv_type} {said(ref.ttft_p50_s, '?')} s, {cand.kv_type} "
        f"{said(cand.ttft_p50_s, '?')} s over the same distinct prompts (up to "
        f"{said(r.prompt_tokens, '?')} tokens, concurrency 1)",
        ("first token's top logprobs differ by at most "
         f"{r.logprob_gap:.4f}" if r.logprob_gap is not None else "logprobs not compared")
        + ("; the same top token" if r.top_token_same else
           "; a different top token" if r.top_token_same is False else ""),
    ]
    return Line(LLAMA_KV_QUANT.title, LLAMA_KV_QUANT.how,
                [f"{ref.kv_type} {said(ref.ttft_p50_s, '?')}",
                 f"{cand.kv_type} {said(cand.ttft_p50_s, '?')}",
                 "none reused (distinct prompts)", cell], evidence,
                measured_on(book, r), r.verdict, LLAMA_KV_QUANT.command,
                anchor=LLAMA_KV_QUANT.label)


def ram_words(book: Notebook) -> str | None:
    """llama.cpp's RAM cache against none, each size's TTFT p50 ratio with its interval and
    the returning turns it lost, for the host-tier answer (None: no such pair)."""
    said = []
    for row, size in ((LLAMA_RAM_ON, "holding every conversation"),
                      (LLAMA_RAM_SMALL, "a third of what the slots lost")):
        found = ram_against_none(book, row.label)
        if found is None:
            continue
        mib = found.on.tier or "size not recorded"
        lost = found.on.sessions.evicted_turns if found.on.sessions else None
        said.append(f"{size} ({mib}): TTFT p50 {found.ttft.cell()}"
                    + (f", {lost} returning turns recomputed" if lost is not None else ""))
    if not said:
        return None
    off = latest(book, LoadRecord, LLAMA_RAM_OFF.label)
    lost_off = off.sessions.evicted_turns if off is not None and off.sessions else None
    held = ram_against_none(book, LLAMA_RAM_ON.label)
    verdict = {"paid": "paid", "cost time": "cost time", "no difference":
               "made no measurable difference"}.get(
        (tier_verdict(held.ttft) if held is not None else None) or "", "was measured")
    return (f"On llama.cpp the RAM prompt cache (its host tier) {verdict} against none"
            + (f" ({lost_off} returning turns recomputed without it)" if lost_off is not None
               else "") + ": " + "; ".join(said))


QUANT_Q = "What did the quantised cache buy, and what did it cost?"


def quant_answer(book: Notebook) -> tuple[str, str] | None:
    """The quantised cache's answer and its figure (None: not measured)."""
    r = latest(book, KvQuantRecord, LLAMA_KV_QUANT.label)
    if r is None or r.tokens_ratio is None:
        return None
    ref, cand, iv = r.reference, r.candidate, r.ttft_p50
    memory = human_bytes(float(r.memory_bytes)) if r.memory_bytes else "the same memory"
    ttft = (f"TTFT p50 x{iv.ratio:.2f} [{iv.low:.2f}, {iv.high:.2f}] ({iv.words})"
            if iv and iv.ratio is not None and iv.low is not None and iv.high is not None
            else "TTFT not compared")
    gap = (f"the first token's top logprobs moved by at most {r.logprob_gap:.4f}"
           if r.logprob_gap is not None else "the logprobs were not compared")
    answer = (f"{cand.kv_type} held {r.tokens_ratio:.2f}x the tokens of {ref.kv_type} in "
              f"{memory} ({cand.kv_cache_tokens:,} against {ref.kv_cache_tokens:,}; a "
              f"{said(r.long_prompt_tokens, '?')}-token prompt: {ref.kv_type} "
              f"{ref.long_prompt.split(':')[0]}, {cand.kv_type} {cand.long_prompt.split(':')[0]})"
              f"; it cost {ttft} on this machine; {gap}.")
    return answer, f"x{r.tokens_ratio:.2f} tokens, {ttft.split(' (')[0]}"
