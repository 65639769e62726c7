"""The RAM cache's size curve in the report (`report/llama_curve.py`): the smallest size that
reached 90% of the best measured gain, "no size paid", the cliff, and the decision."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvlab.records import notebook
from kvlab.records.load import Pressure, SessionsEvidence
from kvlab.records.rows import LLAMA_RAM_CURVE
from kvlab.report import llama_curve
from kvlab.report.decisions import TIER_SIZE_Q, decide
from perrequest import plan, run_row

MIB = 2**20


def curve(book: Path, medians: dict[int, float], recomputed: dict[int, int]) -> None:
    """One curve run: a row per size (MiB), its TTFTs around `medians`, its turns recomputed."""
    rng = np.random.default_rng(1)
    for mib, median in medians.items():
        ttfts = list(median * np.exp(rng.normal(0, 0.05, 60)))
        sessions = SessionsEvidence(conversations=6, turns=4, returning_turns=18,
                                    evicted_turns=recomputed[mib],
                                    held_turns=18 - recomputed[mib], working_set_tokens=9000,
                                    cache_block_tokens=1, cache_block_from="the test",
                                    eviction_rule="the test")
        row = run_row(book, LLAMA_RAM_CURVE.label, 6, ttfts, write=False, run_id="curve",
                      sessions=sessions, pressure=Pressure(
                          state="under pressure", planned=plan(host_tier_bytes=mib * MIB)))
        row.requests_file = row.requests_file.replace(".jsonl", f"-{mib}.jsonl") \
            if row.requests_file else None
        (book.parent / str(row.requests_file)).write_bytes(
            (book.parent / "kvlab-requests" / f"{LLAMA_RAM_CURVE.label}-c6.jsonl").read_bytes())
        notebook.append(book, row)


def test_the_smallest_size_within_90_percent_of_the_best_gain_is_the_answer(
        tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    curve(book, {0: 0.2, 4: 0.19, 8: 0.104, 16: 0.1}, {0: 12, 4: 11, 8: 2, 16: 0})
    found = llama_curve.points(notebook.read(book))
    assert [p.mib for p in found] == [0, 4, 8, 16] and found[0].ttft is None
    said = llama_curve.answer(found)
    assert said.startswith("--cache-ram 8 MiB is the smallest size measured that reached 90% "
                           "of the best gain: TTFT p50 0.5"), said
    assert "(the best, 16 MiB: 0.49x" in said
    assert llama_curve.cliff(found) == ("the cliff: from 4 to 8 MiB the returning turns "
                                        "recomputed fell from 11 to 2")
    decision = next(d for d in decide(notebook.read(book)) if d.question == TIER_SIZE_Q)
    assert decision.decided and decision.answer.startswith("On llama.cpp's RAM cache, "
                                                           "--cache-ram 8 MiB")


def test_no_size_paid_when_no_interval_falls_below_one(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    curve(book, {0: 0.2, 4: 0.2, 8: 0.205}, {0: 12, 4: 12, 8: 12})
    found = llama_curve.points(notebook.read(book))
    assert llama_curve.answer(found).startswith("no size paid: no RAM cache size brought TTFT "
                                                "p50 below none (4 MiB 1.0")
    assert llama_curve.cliff(found) == ("no cliff: the returning turns recomputed did not "
                                        "fall with size")


def test_without_a_curve_the_question_says_what_to_run(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    book.write_text("")
    decision = next(d for d in decide(notebook.read(book)) if d.question == TIER_SIZE_Q)
    assert not decision.decided
    assert "a curve of tier sizes is not in the notebook (no `llama-ram-curve-load` line)" in \
        decision.answer
