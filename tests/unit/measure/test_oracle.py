"""The cache oracle on streams built by hand: prefix sharing in whole blocks, the last token
always computed, LRU eviction (tail first), the tier's recall and limit, on_write against
on_evict, requests in flight, the infinite cache against the trace's own bound, the comparison
with measured figures, and the tier-size curve."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from kvlab.core.errors import InputError
from kvlab.loadgen import trace
from kvlab.measure import intervals, oracle, oracle_gap, oracle_model, oracle_stack
from kvlab.measure.oracle_model import Blocks, CacheModel, Prediction, TierStores

B = 4  # tokens a block in the hand-built streams


def cache(device: int | None, tier: int = 0, *, tier_stores: TierStores = "on_evict",
          keep_last_token: bool = True, concurrency: int = 1) -> CacheModel:
    return CacheModel(B, device, tier, tier_stores, keep_last_token, concurrency)


def cached(stream: Sequence[Blocks | Sequence[int]], model: CacheModel) -> list[int]:
    found = oracle.replay(stream, model)
    assert found == oracle.replay_lru(stream, model)  # the stack pass agrees where it runs
    return [p.cached_tokens for p in found]


def block(name: int) -> list[int]:
    """A block of its own tokens."""
    return [name * 100 + i for i in range(B)]


def test_block_hashes_chain_whole_blocks_only() -> None:
    a = oracle_model.block_hashes([*block(1), *block(2), 7], B)
    assert len(a) == 2  # the partial block has no hash
    assert oracle_model.block_hashes(block(1), B) == a[:1]
    # the same tokens under another parent are another block
    assert oracle_model.block_hashes([*block(3), *block(2)], B)[1] != a[1]
    assert oracle_model.hashed([*block(1), 7], B) == Blocks((a[0],), 5, B)


def test_a_second_request_hits_the_shared_whole_blocks_only() -> None:
    first = [*block(1), *block(2), 1, 2]
    second = [*block(1), *block(2), 1, 2, 3, 4, 5]  # shares 2 blocks and 2 more tokens
    assert cached([first, second], cache(None)) == [0, 2 * B]
    assert cached([first, [*block(9), *block(2)]], cache(None)) == [0, 0]


def test_a_partial_last_block_never_hits() -> None:
    prompt = [*block(1), *block(2), 5, 6]
    assert cached([prompt, prompt], cache(None)) == [0, 2 * B]
    assert cached([prompt, prompt], cache(None, keep_last_token=False)) == [0, 2 * B]


def test_one_token_is_always_computed() -> None:
    whole = [*block(1), *block(2)]
    assert cached([whole, whole], cache(None)) == [0, B]  # the last block is recomputed
    assert cached([whole, whole], cache(None, keep_last_token=False)) == [0, 2 * B]
    assert cached([block(1), block(1)], cache(None)) == [0, 0]
    assert cache(None).servable(2 * B) == 1 and cache(None).servable(2 * B + 1) == 2
    assert cache(None).servable(0) == 0


def test_eviction_is_least_recently_used() -> None:
    a, b, c = block(1), block(2), block(3)
    rules = cache(2, keep_last_token=False)
    # A B A C A B C: C evicts B (A was used since), B evicts C; FIFO would have dropped A
    assert cached([a, b, a, c, a, b, c], rules) == [0, 0, B, 0, B, 0, 0]


def test_a_requests_tail_is_evicted_before_its_head() -> None:
    x = [*block(1), *block(2)]
    rules = cache(3, keep_last_token=False)
    # Z evicts X's last block, not its first (vLLM frees a request's blocks tail first)
    assert cached([x, block(3), block(4), x], rules) == [0, 0, 0, B]


def test_an_evicted_block_is_recalled_from_the_tier_and_promoted() -> None:
    a, b = block(1), block(2)
    found = oracle.replay([a, b, a, b, b], cache(1, 2, keep_last_token=False))
    assert found[2] == Prediction(B, 0, B)  # A went to the tier when B came
    assert found[3] == Prediction(B, 0, B)  # A came back to the device and pushed B out
    assert found[4] == Prediction(B, B, 0)
    assert [p.cached_tokens for p in found] == [0, 0, B, B, B]


def test_the_tier_forgets_past_its_capacity() -> None:
    a, b, c = block(1), block(2), block(3)
    assert cached([a, b, c, a], cache(1, 1, keep_last_token=False)) == [0, 0, 0, 0]
    assert cached([a, b, c, a], cache(1, 2, keep_last_token=False)) == [0, 0, 0, B]
    assert cached([a, b, c, b], cache(1, 1, keep_last_token=False)) == [0, 0, 0, B]


def test_a_tier_written_on_every_prefill_holds_copies() -> None:
    a, b, c = block(1), block(2), block(3)
    evict = cache(1, 1, keep_last_token=False)
    write = cache(1, 1, keep_last_token=False, tier_stores="on_write")
    # on_evict: the tier holds what the device lost; on_write: what was computed last
    assert cached([a, b, a], evict) == [0, 0, B]
    assert cached([a, b, a], write) == [0, 0, 0]
    assert cached([a, b, c, b], write) == [0, 0, 0, 0]
    found = oracle.replay([a, b, a], cache(1, 2, keep_last_token=False, tier_stores="on_write"))
    assert found[2] == Prediction(B, 0, B)


def chunked(device: int, tier: int, chunk: int) -> CacheModel:
    """A tier of `chunk`-block chunks written on every prefill (LMCache's kind)."""
    return CacheModel(B, device, tier, "on_write", concurrency=1, tier_chunk_blocks=chunk)


def test_a_tier_of_chunks_serves_whole_chunks_from_the_first_token_only() -> None:
    six = [*block(1), *block(2), *block(3), *block(4), *block(5), *block(6), 7]
    # blocks by blocks: five of six recalled; by chunks of four: the one whole chunk
    assert cached([six, six], cache(0, 8, tier_stores="on_write")) == [0, 6 * B]
    assert cached([six, six], chunked(0, 8, 4)) == [0, 4 * B]
    found = oracle.replay([six, six], chunked(0, 8, 2))
    assert found[1] == Prediction(6 * B + 1, 0, 6 * B)  # three chunks of two
    # the device already holds three blocks: a tier chunk of two reaches no further
    three = [*block(1), *block(2), *block(3), 7]
    assert cached([three, three], chunked(3, 8, 2)) == [0, 3 * B]
    assert oracle.replay([three, three], chunked(3, 8, 2))[1].tier_hit_tokens == 0
    # once B took the device's one block, the tier serves the first request's whole chunk
    b = [*block(8), 7]
    found = oracle.replay([three, b, three], chunked(1, 8, 2))
    assert found[2].tier_hit_tokens == 2 * B


def test_a_tier_of_chunks_forgets_whole_chunks_past_its_capacity() -> None:
    a, b = [*block(1), *block(2), 7], [*block(3), *block(4), 7]
    assert cached([a, b, a], chunked(0, 2, 2)) == [0, 0, 0]  # one chunk kept: B's
    assert cached([a, b, a], chunked(0, 4, 2)) == [0, 0, 2 * B]
    assert cached([a, b, a], chunked(0, 3, 2)) == [0, 0, 0]  # three blocks hold one chunk


def test_a_tier_of_chunks_is_written_on_every_prefill_or_refused() -> None:
    with pytest.raises(InputError, match="tier_stores='on_write'"):
        CacheModel(B, 4, 8, "on_evict", tier_chunk_blocks=16)
    with pytest.raises(InputError, match="tier_chunk_blocks 0"):
        CacheModel(B, 4, 8, "on_write", tier_chunk_blocks=0)


def test_blocks_of_requests_in_flight_are_not_evicted() -> None:
    a, b = block(1), block(2)
    assert cached([a, a, a], cache(0, keep_last_token=False)) == [0, 0, 0]
    assert cached([a, a, a], cache(0, keep_last_token=False, concurrency=2)) == [0, B, B]
    # the first A is still running when the second arrives at concurrency 3, not at 2
    assert cached([a, b, a], cache(0, keep_last_token=False, concurrency=2)) == [0, 0, 0]
    assert cached([a, b, a], cache(0, keep_last_token=False, concurrency=3)) == [0, 0, B]


def test_the_infinite_cache_agrees_with_the_traces_reusable_blocks() -> None:
    requests = trace.synthetic(300, groups=3, shared_blocks=3, own_blocks=(1, 3),
                               block_tokens=16, seed=4)
    stream = oracle_model.from_trace(requests, 16)
    reusable = trace.reusable_blocks(requests, 16)
    whole = oracle.infinite_cache(stream, CacheModel(16, None, keep_last_token=False))
    assert [p.cached_tokens for p in whole] == [n * 16 for n in reusable]
    kept = oracle.infinite_cache(stream, CacheModel(16, 8))  # unbounded, one token computed
    assert [p.cached_tokens for p in kept] == [
        min(n, (r.input_length - 1) // 16) * 16 for n, r in zip(reusable, requests, strict=True)]
    summary = oracle.summarize(stream, CacheModel(16, 4, keep_last_token=False))
    assert summary.infinite_cache_tokens == sum(reusable) * 16
    assert summary.cached_tokens < summary.infinite_cache_tokens


def test_the_summary_adds_up() -> None:
    a, b = block(1), block(2)
    stream = [[*a, 9], [*b, 9], [*a, 9], [*b, *a, 9], [*a, 9]]
    summary = oracle.summarize(stream, cache(1, 1))
    assert summary.requests == 5 and summary.prompt_tokens == 4 * 5 + 9
    # A from the tier, then B from the tier; the last A was pushed out of both
    assert (summary.device_hit_tokens, summary.tier_hit_tokens) == (0, 2 * B)
    assert summary.cached_tokens == 2 * B and summary.infinite_cache_tokens == 3 * B
    assert summary.hit_share == pytest.approx(2 * B / 29)
    assert summary.infinite_cache_share == pytest.approx(3 * B / 29)
    assert summary.model_dump(mode="json")["cache"]["tier_stores"] == "on_evict"
    empty = oracle.summarize([], cache(1))
    assert empty.hit_share is None and empty.requests == 0


def test_lists_that_are_not_chains_are_replayed_block_by_block() -> None:
    twice = Blocks((1, 2, 1), 3 * B, B)
    stream = [Blocks((1, 2), 2 * B, B), twice, Blocks((2, 5), 2 * B + 1, B), twice]
    model = cache(2, 1)
    assert oracle_stack._stack_depths(stream, model) is None  # the stack pass declines
    # an id is a block wherever it stands: the third request finds block 2
    assert cached(stream, model) == [0, 2 * B, B, B]


def test_block_tokens_of_one_matches_tokens() -> None:
    """llama-server's longest common prefix, approximated: a block a token."""
    model = CacheModel(1, None)
    assert [p.cached_tokens for p in oracle.replay([[1, 2, 3, 4], [1, 2, 3, 9, 9]], model)] \
        == [0, 3]
    assert [p.cached_tokens for p in oracle.replay([[1, 2, 3], [1, 2, 3]], model)] == [0, 2]


def test_bad_models_and_mixed_block_sizes_are_refused() -> None:
    for bad in ({"block_tokens": 0}, {"device_blocks": -1}, {"tier_blocks": -1},
                {"concurrency": 0}, {"tier_stores": "sometimes"}):
        with pytest.raises(InputError):
            CacheModel(**{"block_tokens": 4, "device_blocks": 8, **bad})  # type: ignore[arg-type]
    with pytest.raises(InputError, match="do not fit"):
        Blocks((1, 2, 3), 11, 4)
    with pytest.raises(InputError, match="blocks of 8 tokens"):
        oracle.replay([oracle_model.hashed(list(range(16)), 8)], cache(4))


def test_left_on_the_table_is_the_oracle_less_what_was_measured() -> None:
    predicted = [Prediction(100, 64, 0), Prediction(100, 32, 32), Prediction(50, 0, 0)]
    found = oracle_gap.compare(predicted, [32, None, 16])
    assert [g.left_tokens for g in found.gaps] == [32, None, -16]
    assert found.requests == 2 and found.prompt_tokens == 150
    assert (found.predicted_tokens, found.measured_tokens, found.left_tokens) == (64, 48, 16)
    assert found.left_share == pytest.approx(16 / 150)
    assert found.mean_share == pytest.approx((0.32 - 0.32) / 2)
    assert found.above_oracle == 1  # the engine served more than the model has
    assert found.low is None and found.high is None  # too few requests for an interval
    with pytest.raises(InputError, match="one measurement"):
        oracle_gap.compare(predicted, [1, 2])


def test_the_interval_of_the_share_left_on_the_table() -> None:
    rng = random.Random(3)
    predicted = [Prediction(1000, 800, 0) for _ in range(400)]
    measured = [rng.choice([800, 800, 600, 400]) for _ in predicted]
    found = oracle_gap.compare(predicted, measured)
    mean = sum(800 - m for m in measured) / 400 / 1000
    assert found.mean_share == pytest.approx(mean)
    assert found.low is not None and found.high is not None
    assert found.low < mean < found.high and found.high - found.low < 0.05
    assert found == oracle_gap.compare(predicted, measured)  # seeded: the same every time
    exact = oracle_gap.compare(predicted, [800] * 400)
    assert (exact.mean_share, exact.low, exact.high) == (0.0, 0.0, 0.0)
    assert intervals.MIN_SAMPLES == 5


def _sessions(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(50) for _ in range(3 * B)]
    history = [[*system, rng.randrange(50)] for _ in range(8)]
    out = []
    for _ in range(count):
        talk = history[rng.randrange(len(history))]
        talk += [rng.randrange(50) for _ in range(rng.randint(1, 3 * B))]
        out.append(list(talk))
    return out


def test_the_tier_curve_never_falls_and_matches_a_replay_per_size() -> None:
    stream = _sessions(300, seed=5)
    sizes = list(range(0, 120, 6))
    for rules in (cache(10), cache(10, tier_stores="on_write")):
        points = oracle.curve(stream, sizes, rules)
        shares = [p.hit_share or 0.0 for p in points]
        assert shares == sorted(shares) and shares[-1] > shares[0]
        for size, point in zip(sizes[::5], points[::5], strict=True):
            sized = oracle.summarize(stream, CacheModel(B, 10, size, rules.tier_stores))
            assert point.cached_tokens == sized.cached_tokens and point.tier_blocks == size
    unbounded = oracle.curve(stream, [0, 50], cache(None))
    assert unbounded[0] == oracle.CurvePoint(0, unbounded[1].cached_tokens,
                                             unbounded[1].hit_share)


def test_a_curve_over_some_requests_counts_only_those() -> None:
    """The level hook counts the measured requests, the warm-up replayed but not counted:
    the curve over a subset equals each size's replay summed over that subset."""
    from dataclasses import replace

    rng = random.Random(3)
    stream: list[list[int]] = []
    for _ in range(40):
        base = [rng.randrange(50) for _ in range(rng.randrange(10, 80))]
        for _ in range(4):
            base = base + [rng.randrange(50) for _ in range(rng.randrange(5, 40))]
            stream.append(list(base))
    rng.shuffle(stream)
    blocks = oracle.prepare(stream, 4)
    kept = [i for i in range(len(blocks)) if i % 3]
    for concurrency in (1, 5):
        cache = CacheModel(4, 60, concurrency=concurrency)
        for size in (0, 30, 60, 120):
            p = oracle.replay(blocks, replace(cache, tier_blocks=size))
            want = sum(p[i].cached_tokens for i in kept) / sum(p[i].prompt_tokens for i in kept)
            assert oracle.curve(blocks, [size], cache, kept)[0].hit_share == pytest.approx(want)
