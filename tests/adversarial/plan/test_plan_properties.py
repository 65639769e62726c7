"""Properties of the plan's simulator, with hypothesis, on random traces whose prompts share
prefixes of block ids (a small alphabet of ids, so they collide), random arrival gaps, output
lengths, cache and tier sizes, policies and replica counts:

- no replica's cache serves more than one unbounded cache holding every request would (the
  single-cache oracle), nor less than nothing; per request, at most its servable blocks;
- one replica, under every policy, is the oracle's own replay of the stream, request by request;
- every request gets a replica, a TTFT of at least its own prefill, and the requests per
  replica add up to the stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.loadgen.trace import TraceRequest
from kvlab.measure import CacheModel, oracle
from kvlab.plan.answers import point
from kvlab.plan.routing import POLICIES, Policy
from kvlab.plan.simulate import simulate
from kvlab.plan.stream import from_trace
from kvlab.records import ReplicaProfile

PROPS = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


@st.composite
def traces(draw: Any) -> list[TraceRequest]:
    """Requests whose hash ids extend a cut of an earlier one's (or start afresh)."""
    out: list[TraceRequest] = []
    at = 0.0
    fresh = 1000
    for _ in range(draw(st.integers(1, 24))):
        ids: list[int] = []
        if out and draw(st.booleans()):
            earlier = draw(st.sampled_from(out)).hash_ids
            ids = list(earlier[:draw(st.integers(0, len(earlier)))])
        for _ in range(draw(st.integers(0, 4))):
            if draw(st.booleans()):
                ids.append(draw(st.integers(0, 3)) + 10 * len(ids))  # collide by position
            else:
                fresh += 1
                ids.append(fresh)
        length = max(1, len(ids) * 8 - draw(st.integers(0, 7)) + draw(st.integers(0, 3)))
        at += draw(st.floats(0, 2))
        out.append(TraceRequest(at * 1000, length, draw(st.integers(0, 5)), tuple(ids)))
    return out


@st.composite
def profiles(draw: Any) -> ReplicaProfile:
    return ReplicaProfile(block_tokens=draw(st.sampled_from((2, 4, 8))),
                          device_blocks=draw(st.integers(0, 16)),
                          prefill_s_per_token=draw(st.floats(0, 0.01)),
                          recall_s_per_token=draw(st.floats(0, 0.001)),
                          decode_step_s=draw(st.floats(0, 0.05)),
                          decode_step_per_seq_s=draw(st.floats(0, 0.01)),
                          max_seqs=draw(st.integers(1, 4)))


@PROPS
@given(traces(), profiles(), st.sampled_from(POLICIES), st.integers(1, 5), st.integers(0, 8))
def test_no_replica_serves_more_than_one_unbounded_cache(
        trace: list[TraceRequest], profile: ReplicaProfile, policy: Policy, replicas: int,
        tier: int) -> None:
    stream = from_trace(trace, profile.block_tokens, trace_block=8)
    out = simulate(stream, profile, replicas, policy, tier)
    served = out.device_blocks + out.tier_blocks_hit
    cache = CacheModel(profile.block_tokens, profile.device_blocks)
    unbounded = [p.cached_tokens // profile.block_tokens
                 for p in oracle.infinite_cache(stream.blocks, cache)]
    assert (served >= 0).all() and (out.device_blocks >= 0).all()
    assert int(served.sum()) <= sum(unbounded)
    limits = [cache.servable(r.prompt_tokens) for r in stream.blocks]
    assert (served <= np.array(limits)).all()
    found = point(out)
    assert found.hit_share is None or 0 <= found.hit_share <= 1
    assert sum(found.requests_per_replica) == len(trace)
    assert ((out.replica >= 0) & (out.replica < replicas)).all()
    uncached = out.prompt_tokens - served * profile.block_tokens
    assert (out.ttft_s >= uncached * profile.prefill_s_per_token - 1e-9).all()


@PROPS
@given(traces(), profiles(), st.sampled_from(POLICIES), st.integers(0, 8))
def test_one_replica_is_the_oracles_replay(trace: list[TraceRequest], profile: ReplicaProfile,
                                           policy: Policy, tier: int) -> None:
    stream = from_trace(trace, profile.block_tokens, trace_block=8)
    out = simulate(stream, profile, 1, policy, tier)
    cache = CacheModel(profile.block_tokens, profile.device_blocks, tier)
    replayed = oracle.replay(stream.blocks, cache)
    b = profile.block_tokens
    assert out.device_blocks.tolist() == [p.device_hit_tokens // b for p in replayed]
    assert out.tier_blocks_hit.tolist() == [p.tier_hit_tokens // b for p in replayed]
