"""Properties of the cache oracle, with hypothesis, on random streams whose prompts grow from
earlier ones over a small alphabet (so prefixes collide), random block sizes and capacities:

- a request is served between 0 and its prompt (less the token always computed), in whole
  blocks, and never more than an unbounded cache would serve it;
- a tier (on_evict) adds hits and takes none: the device serves the same with or without it;
- inclusion: a bigger tier serves every request at least as much, however it is filled and
  at any concurrency (`curve` never falls); so does a bigger device without a tier, or with
  one filled on eviction at concurrency 1 (device and tier are then one LRU);
- the stack pass gives exactly the block-by-block replay's figures;
- llama-server's slots (`slot_oracle`): between 0 and the prompt less one token, never more
  than any earlier prompt could have served, at any slot count, threshold and overlap, with
  or without a RAM prompt cache of any limit; the common prefix by halving equals the
  token-by-token one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.measure import oracle, slot_oracle
from kvlab.measure.oracle_model import CacheModel, Prediction

PROPS = settings(max_examples=120, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@st.composite
def streams(draw: Any) -> list[list[int]]:
    """Prompts that each extend a cut of an earlier one (or start afresh) by a few tokens."""
    alphabet = draw(st.integers(1, 3))
    tokens = st.lists(st.integers(0, alphabet - 1), max_size=12)
    out: list[list[int]] = []
    for _ in range(draw(st.integers(0, 14))):
        base: list[int] = []
        if out and draw(st.booleans()):
            earlier = draw(st.sampled_from(out))
            base = earlier[:draw(st.integers(0, len(earlier)))]
        out.append(base + draw(tokens))
    return out


@st.composite
def models(draw: Any) -> CacheModel:
    return CacheModel(block_tokens=draw(st.integers(1, 8)),
                      device_blocks=draw(st.one_of(st.none(), st.integers(0, 12))),
                      tier_blocks=draw(st.integers(0, 8)),
                      tier_stores=draw(st.sampled_from(["on_evict", "on_write"])),
                      keep_last_token=draw(st.booleans()),
                      concurrency=draw(st.integers(1, 3)))


def _cached(found: list[Prediction]) -> list[int]:
    return [p.cached_tokens for p in found]


@PROPS
@given(streams(), models())
def test_a_request_is_served_within_its_prompt_and_the_infinite_cache(
        stream: list[list[int]], model: CacheModel) -> None:
    found = oracle.replay(stream, model)
    infinite = oracle.infinite_cache(stream, model)
    keep = int(model.keep_last_token)
    for prompt, p, bound in zip(stream, found, infinite, strict=True):
        assert p.prompt_tokens == len(prompt)
        assert p.device_hit_tokens >= 0 and p.tier_hit_tokens >= 0
        assert p.cached_tokens % model.block_tokens == 0
        assert p.cached_tokens <= max(0, len(prompt) - keep)
        assert p.cached_tokens <= bound.cached_tokens
    summary = oracle.summarize(stream, model)
    assert summary.cached_tokens == sum(_cached(found))
    assert summary.infinite_cache_tokens == sum(_cached(infinite))


@PROPS
@given(streams(), models())
def test_a_tier_filled_on_eviction_only_adds_hits(stream: list[list[int]],
                                                 model: CacheModel) -> None:
    bare = oracle.replay(stream, CacheModel(model.block_tokens, model.device_blocks,
                                            keep_last_token=model.keep_last_token,
                                            concurrency=model.concurrency))
    with_tier = oracle.replay(stream, CacheModel(model.block_tokens, model.device_blocks,
                                                 model.tier_blocks, "on_evict",
                                                 model.keep_last_token, model.concurrency))
    for a, b in zip(bare, with_tier, strict=True):
        assert b.device_hit_tokens == a.device_hit_tokens  # the device never sees the tier
        assert b.cached_tokens >= a.cached_tokens
    assert sum(_cached(with_tier)) >= sum(_cached(bare))


@PROPS
@given(streams(), models(), st.integers(0, 10), st.integers(0, 6))
def test_bigger_caches_serve_every_request_at_least_as_much(
        stream: list[list[int]], model: CacheModel, device: int, tier: int) -> None:
    def run(d: int, t: int) -> list[int]:
        return _cached(oracle.replay(stream, replace(model, device_blocks=d, tier_blocks=t)))

    small, bigger_tier = run(device, tier), run(device, tier + 1)
    assert all(b >= a for a, b in zip(small, bigger_tier, strict=True))
    if tier == 0 or (model.concurrency == 1 and model.tier_stores == "on_evict"):
        assert all(b >= a for a, b in zip(small, run(device + 1, tier), strict=True))
    points = oracle.curve(stream, list(range(tier + 4)), replace(model, device_blocks=device))
    totals = [p.cached_tokens for p in points]
    assert totals == sorted(totals) and totals[tier] == sum(small)


@PROPS
@given(streams(), models())
def test_the_stack_pass_agrees_with_the_block_by_block_replay(
        stream: list[list[int]], model: CacheModel) -> None:
    assert oracle.replay(stream, model) == oracle.replay_lru(stream, model)


@st.composite
def ram_caches(draw: Any) -> slot_oracle.RamCache | None:
    """No RAM cache, or one of a few tokens' bytes up to none, idle slots saved or not."""
    if draw(st.booleans()):
        return None
    return slot_oracle.RamCache(limit_bytes=draw(st.integers(0, 40)), bytes_per_token=1.0,
                                limit_tokens=draw(st.integers(0, 30)),
                                save_idle=draw(st.booleans()), unified=draw(st.booleans()))


@PROPS
@given(streams(), st.integers(1, 4), st.sampled_from([0.0, 0.1, 0.5, 0.9]),
       st.lists(st.floats(0.0, 3.0), min_size=14, max_size=14), ram_caches())
def test_slots_serve_within_the_prompt_and_the_unbounded_bound(
        prompts: list[list[int]], slots: int, similarity: float, spans: list[float],
        ram: slot_oracle.RamCache | None) -> None:
    stream = [slot_oracle.SlotRequest(p, float(i), float(i) + spans[i])
              for i, p in enumerate(prompts)]
    got = slot_oracle.replay(stream, slot_oracle.SlotCache(slots, similarity), ram)
    bound = slot_oracle.unbounded(stream)
    for request, served, most in zip(stream, got, bound, strict=True):
        assert 0 <= served <= max(0, len(request.tokens) - 1)
        assert served <= most


@PROPS
@given(st.lists(st.integers(0, 2), max_size=40), st.lists(st.integers(0, 2), max_size=40))
def test_the_common_prefix_by_halving_is_the_token_by_token_one(a: list[int],
                                                                b: list[int]) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert slot_oracle.common_prefix(a, b) == n == slot_oracle.common_prefix(b, a)
