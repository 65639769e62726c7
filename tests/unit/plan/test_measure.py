"""A profile read from two measured levels: each figure from the engine's counters, sourced."""

from __future__ import annotations

import pytest

from kvlab.core import InputError
from kvlab.plan.measure import profile_of
from kvlab.records import LoadRecord, Percentiles, ReplicaProfile, TtftAccount


def row(concurrency: int, tpot_p50: float, deltas: dict[str, float | None],
        outside: float | None = 0.004) -> LoadRecord:
    account = TtftAccount(source="histograms", requests=8, client_ttft=0.05, queue=0.001,
                          prefill=0.04, engine_ttft=0.046, outside=outside)
    return LoadRecord(label=f"c{concurrency}", lab="manual", concurrency=concurrency,
                      requests=8, ok=8, failed=0, tpot_s=Percentiles(p50=tpot_p50),
                      ttft_s=Percentiles(p50=0.05), ttft_account=account,
                      metric_deltas=deltas)


COLD = {"engine_prefill_s": 0.32, "engine_prefill_n": 8, "prompt_tokens": 1700,
        "prefix_cache_hits": 100}


def test_two_levels_give_prefill_per_computed_token_and_the_decode_line() -> None:
    profile, levels = profile_of([row(1, 0.010, COLD), row(4, 0.016, {})], 16, 5000, 4,
                                 shape_from="shape", max_seqs_from="argv")
    assert profile.prefill_s_per_token == pytest.approx(0.32 / 1600)  # hits not computed
    assert profile.decode_step_per_seq_s == pytest.approx(0.002)  # (0.016 - 0.010) / 3
    assert profile.decode_step(1) == pytest.approx(0.010)
    assert profile.decode_step(4) == pytest.approx(0.016)
    assert profile.ttft_fixed_s == pytest.approx(0.05 - 0.001 - 0.04)  # client - queue - prefill
    assert (profile.block_tokens, profile.device_blocks, profile.max_seqs) == (16, 5000, 4)
    assert set(profile.sources) == set(ReplicaProfile.model_fields) - {"sources"}
    assert [lv.concurrency for lv in levels] == [1, 4]
    assert levels[0].cached_tokens == 100 and levels[0].prefill_s == 0.32


def test_a_larger_batch_decoding_no_slower_gives_no_negative_slope() -> None:
    profile, _ = profile_of([row(1, 0.010, COLD), row(4, 0.009, {})], 16, 5000, 4,
                            shape_from="shape", max_seqs_from="argv")
    assert profile.decode_step_per_seq_s == 0 and profile.decode_step_s == 0.010


def test_an_engine_without_the_prefill_histogram_is_named() -> None:
    with pytest.raises(InputError, match="no prefill-time histogram"):
        profile_of([row(1, 0.01, {"prompt_tokens": 10}), row(4, 0.02, {})], 16, 10, 4,
                   shape_from="s", max_seqs_from="a")
