"""The offload lab's decisions about the tiers beside the host tier: did the store shared by
two instances pay, what the disk tier cost and would save (with mlx-lm's prompt-cache file
where it ran), and what llama.cpp's quantised cache bought against f16. Each is one sentence
with its figures, or "not enough evidence" and why.

It does not answer the host tier's questions (`decisions_host.py`), nor add the user's own
answer (`decisions.py`); the quantised cache's words are `llama.py`'s. Nothing here measures.
"""

from __future__ import annotations

from dataclasses import replace

from kvlab.measure import intervals
from kvlab.records import (
    DISK,
    LLAMA_KV_QUANT,
    MLX_CACHE,
    PROVEN,
    SHARED_STORE,
    VLLM_DISK,
    DiskRecord,
    KvQuantRecord,
    Notebook,
    ReuseRecord,
)
from kvlab.report.common import latest, num
from kvlab.report.decisions_common import Decision, Mark, Outcome, Panel, _absent, _undecided
from kvlab.report.llama import QUANT_Q, quant_answer
from kvlab.report.offload import summary
from kvlab.report.stores import Store, ran, why

# ---------------------------------------------------------------- offload: the store

STORE_Q = "Did the store pay?"


def store(book: Notebook) -> Decision:
    """Each store that ran judged on turn 2 on the second instance: the seed's alone as it
    always was; with LMCache's (or LMCache's alone), one sentence each saying which paid and
    why, from how its connector matches a growing conversation's prompt."""
    found = ran(book)
    if not found:
        return _undecided("offload", STORE_Q, _absent(book, SHARED_STORE.label,
                                                      "the alternating run"))
    if len(found) == 1 and found[0][0].seed:
        return _judge(book, *found[0])
    judged = [_judge(book, s, alt, named=True) for s, alt in found]
    decided = [d for d in judged if d.decided]
    paid = [d for d in decided if d.outcome == "yes"]
    chart = Panel("ratio", "TTFT, store / reference",
                  tuple(m for d in judged for p in d.chart for m in p.marks))
    heads = "; ".join(d.head for d in decided)
    return Decision("offload", STORE_Q, " ".join(d.answer for d in judged), bool(decided),
                    "; ".join(d.figure for d in decided),
                    rows=tuple(s.alternating.label for s, _ in found),
                    headline=heads if decided else "",
                    outcome="yes" if paid else "no", chart=(chart,))


def _judge(book: Notebook, store: Store, alt: ReuseRecord, named: bool = False) -> Decision:
    """One store's answer; `named`: the store's name first and why its connector did or did
    not serve turn 2 (where more than the seed's store is judged)."""
    lab, name = "offload", f"{store.connector.called}'s store" if named else "the store"
    rows = alt.rows
    if len(alt.endpoints) < 2 or len(rows) < 2:
        return _undecided(lab, STORE_Q, f"the {store.alternating.label} line has one endpoint "
                                        "or one turn: no turn ran on the second instance")
    t1, t2 = rows[0].ttft_s, rows[1].ttft_s
    verdicts = alt.summary.later_turn_verdicts if alt.summary is not None else None
    if not verdicts:
        return _undecided(lab, STORE_Q, f"{'for ' + name + ', ' if named else ''}turn 2 on "
                                        f"the second instance took {num(t2)} s against turn "
                                        f"1's {num(t1)} s, but no per-turn cache evidence was "
                                        "recorded, so warm-up is not ruled out")
    store_kind = f"the {alt.connector} connector's store" if alt.connector else "a store"
    cached = rows[1].cached_tokens
    served = verdicts[0] == "reused"
    # served and faster: a turn 2 that took the store's KV no sooner than turn 1 computed its
    # own did not pay, however many tokens it took
    paid = served and t1 is not None and t2 is not None and t2 < t1
    cap = name[0].upper() + name[1:]
    head = (f"{cap} paid: turn 2 on the second instance took {num(t2)} s against turn 1's "
            f"{num(t1)} s on the first" + (f" ({cached:,} prompt tokens from the store)"
                                            if cached else "")
            if paid else _served_slower(cap, t1, t2, cached) if served else
            f"{cap} did not pay: turn 2 on the second instance was judged {verdicts[0]}, "
            f"with {cached or 0:,} prompt tokens from it, so its {num(t2)} s against turn 1's "
            f"{num(t1)} s is not the store's doing")
    figure = (f"turn 2 {num(t2)} s against turn 1 {num(t1)} s" if served
              else f"turn 2 took {cached or 0:,} prompt tokens from the store")
    answer = (f"{head}, with {store_kind} shared by two instances; "
              f"{_control(book, store, alt)}." if not named
              else (f"{_named(cap, alt, paid, verdicts[0])}: {why(store, alt, served)}"
                    if paid or not served else
                    f"{_served_slower(cap, t1, t2, cached)}: {why(store, alt, served)}")
              + ("" if served else f"; its {num(t2)} s against turn 1's {num(t1)} s is not "
                 "the store's doing") + f"; {_control(book, store, alt)}.")
    return Decision(lab, STORE_Q, answer, True,
                    (f"{store.connector.called}: " if named else "") + figure,
                    headline=f"{cap} paid" if paid else f"{cap} did not pay",
                    outcome="yes" if paid else "no",
                    chart=(_store_panel(book, store, alt, paid, named),))


def _served_slower(cap: str, t1: float | None, t2: float | None, cached: int | None) -> str:
    """A store that served turn 2 without making it faster: the cause in its words."""
    return (f"{cap} served turn 2 but did not pay: turn 2 on the second instance took "
            f"{cached or 0:,} prompt tokens from it and still {num(t2)} s against turn 1's "
            f"{num(t1)} s computed whole, so fetching those tokens' KV cost this machine as "
            "much as computing them")


def _named(cap: str, alt: ReuseRecord, paid: bool, verdict: str) -> str:
    """A named store's answer up to its why: what turn 2 on the second instance took."""
    turn1, turn2 = alt.rows[0], alt.rows[1]
    took = (f"{turn2.cached_tokens or 0:,} of its {turn2.prompt_tokens:,} prompt tokens"
            if turn2.prompt_tokens else f"{turn2.cached_tokens or 0:,} prompt tokens")
    if paid:
        return (f"{cap} paid: turn 2 on the second instance took {num(turn2.ttft_s)} s against "
                f"turn 1's {num(turn1.ttft_s)} s on the first, with {took} from the store")
    return (f"{cap} did not pay: turn 2 on the second instance took {took} from it (judged "
            f"{verdict})")


def _store_panel(book: Notebook, store: Store, alt: ReuseRecord, paid: bool = True,
                 named: bool = False) -> Panel:
    """The store's chart: turn 2 on the second instance against turn 1 on the first (where
    the store served it: otherwise the ratio is not the store's), and the later turns
    alternating against one instance with the same store (the control); `named`: each mark
    says whose store it is."""
    t1, t2 = alt.rows[0].ttft_s, alt.rows[1].ttft_s
    who = f"{store.connector.called}: " if named else ""
    marks = [Mark(f"{who}turn 2 / turn 1", t2 / t1)] if t1 and t2 and paid else []
    single = latest(book, ReuseRecord, store.single.label)
    if single is not None:
        spread = intervals.reuse_turns(book.records, alt, single)
        best_alt, best_one = summary(alt).best_later_ttft_s, summary(single).best_later_ttft_s
        if spread.measured and (mark := Mark.of(f"{who}later / control", spread)):
            marks.append(mark)
        elif best_alt and best_one:
            marks.append(Mark(f"{who}later / control", best_alt / best_one))
    return Panel("ratio", "TTFT, store / reference", tuple(marks))


def _control(book: Notebook, store: Store, alt: ReuseRecord) -> str:
    single = latest(book, ReuseRecord, store.single.label)
    if single is None:
        return ("whether the store adds latency of its own is not measured (no "
                f"{store.single.label} control)")
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
        True, f"first token {num(after)} s after restore against {num(cold)} s cold",
        headline=_disk_headline("llama.cpp", after, cold), outcome=_saved(after, cold),
        chart=(_disk_panel("llama.cpp", r),))


def _saved(after: float, cold: float) -> Outcome:
    return "yes" if after < cold else "no"


def _disk_headline(engine: str, after: float, cold: float) -> str:
    if after < cold:
        return (f"On {engine}, a restore from disk started {cold / after:,.0f}x faster than "
                "a cold prefill" if after else f"On {engine}, a restore from disk beat a "
                "cold prefill")
    return f"On {engine}, a restore from disk was no faster than a cold prefill"


def _disk_panel(engine: str, r: DiskRecord) -> Panel:
    """The first token after a restore against a cold prefill, as a ratio."""
    after, cold = r.post_restore_ttft_s, r.cold_ttft_s
    return Panel("ratio", "first token, restored / cold", (Mark(engine, after / cold),)
                 if after is not None and cold else ())


def with_vllm(found: Decision, book: Notebook) -> Decision:
    """The disk answer with vLLM's fs tier (read back after a restart), where it ran; it
    decides the question where llama.cpp's slot file did not run."""
    r = latest(book, DiskRecord, VLLM_DISK.label)
    if r is None or r.cold_ttft_s is None or r.post_restore_ttft_s is None:
        return found
    ev = r.evidence
    control = ev.control.ttft_s if ev is not None and ev.control is not None else None
    words = (f"On vLLM, the fs tier ({r.file_bytes or 0:,} bytes of block files, {r.verdict}) "
             f"served {r.post_restore_cached_tokens or 0:,} of {r.prompt_tokens:,} tokens after "
             f"a restart, and the first token took {num(r.post_restore_ttft_s)} s against "
             f"{num(r.cold_ttft_s)} s from cold"
             + (f" ({num(control)} s for a new prompt on the restarted vLLM)"
                if control is not None else ""))
    return _other_disk(found, r, "vLLM", words, "from the files")


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
    return _other_disk(found, r, "mlx-lm", words, "after load")


def _other_disk(found: Decision, r: DiskRecord, engine: str, words: str, how: str) -> Decision:
    """Another engine's disk line beside the answer found (`words` said of it); it decides
    the question where that answer did not and its own reuse was proven."""
    if found.decided or r.verdict != PROVEN:
        return found.extended(words).charted(_disk_panel(engine, r))
    after, cold = r.post_restore_ttft_s, r.cold_ttft_s
    assert after is not None and cold is not None  # its caller's check
    return Decision("offload", DISK_Q, words + ".", True,
                    f"first token {num(after)} s {how} against {num(cold)} s cold",
                    headline=_disk_headline(engine, after, cold), outcome=_saved(after, cold),
                    chart=(_disk_panel(engine, r),), rows=found.rows)


# ---------------------------------------------------------------- offload: the quantised cache

def quantised(book: Notebook) -> Decision:
    """llama.cpp's q8_0 cache against f16 in the same memory."""
    found = quant_answer(book)
    if found is None:
        return replace(_undecided("offload", QUANT_Q, _absent(
            book, LLAMA_KV_QUANT.label, "the quantised cache against f16")),
            rows=(LLAMA_KV_QUANT.label,))
    r = latest(book, KvQuantRecord, LLAMA_KV_QUANT.label)
    assert r is not None and r.tokens_ratio  # quant_answer found it
    iv, ref, cand = r.ttft_p50, r.reference.kv_type, r.candidate.kv_type
    marks = [Mark("KV bytes a token", 1 / r.tokens_ratio)]
    if iv is not None and iv.ratio is not None:
        marks.append(Mark("TTFT p50", iv.ratio, iv.low, iv.high))
    slower = iv is not None and iv.low is not None and iv.low > 1
    more = r.tokens_ratio > 1
    outcome: Outcome = "choice" if more and slower else "yes" if more else "no"
    head = (f"{cand} held {r.tokens_ratio:.2f}x the tokens of {ref}"
            + (" and was slower to first token" if slower else ""))
    return Decision("offload", QUANT_Q, found[0], True, found[1], (LLAMA_KV_QUANT.label,),
                    headline=head, outcome=outcome,
                    chart=(Panel("ratio", f"{cand} / {ref}", tuple(marks), "less", "more"),))
