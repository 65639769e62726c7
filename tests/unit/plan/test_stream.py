"""The plan's streams: a trace in the cache's blocks, user sessions, and their keys."""

from __future__ import annotations

import pytest

from kvlab.core import InputError
from kvlab.loadgen import ThinkTime
from kvlab.loadgen.trace import TraceRequest
from kvlab.plan.stream import Keys, Sessions, from_trace, repeated, sessions


def test_a_trace_in_smaller_cache_blocks_shares_exactly_what_its_tokens_share() -> None:
    reqs = [TraceRequest(0, 20, 4, (1, 2, 3)), TraceRequest(1000, 16, 4, (1, 2)),
            TraceRequest(2000, 18, 4, (1, 5, 6))]
    s = from_trace(reqs, 4, trace_block=8)
    a, b, c = (r.hashes for r in s.blocks)
    assert len(a) == 5 and len(b) == 4 and len(c) == 4
    assert a[:4] == b  # blocks 1 and 2 whole in both
    assert a[:2] == c[:2] and a[2] != c[2]  # only block 1 shared with the third
    assert s.arrival_s.tolist() == [0.0, 1.0, 2.0]


def test_a_trace_in_its_own_block_size_keeps_its_ids() -> None:
    s = from_trace([TraceRequest(0, 1030, 1, (4, 5, 6))], 512, trace_block=512)
    assert s.blocks[0].hashes == (4, 5)


def test_own_tokens_are_no_one_elses() -> None:
    # both requests run past their hash ids: their last blocks are their own
    reqs = [TraceRequest(0, 12, 1, (1,)), TraceRequest(1, 12, 1, (1,))]
    s = from_trace(reqs, 4, trace_block=8)
    assert s.blocks[0].hashes[:2] == s.blocks[1].hashes[:2]
    assert s.blocks[0].hashes[2] != s.blocks[1].hashes[2]
    assert s.conversation_key[0] != s.conversation_key[1]  # the proxy hashes whole prompts
    assert s.prefix_key[0] != s.prefix_key[1]  # 12 tokens: under one 16-token block, all


def test_the_prefix_key_reads_only_the_leading_blocks() -> None:
    reqs = [TraceRequest(0, 100, 1, (1, 2)), TraceRequest(1, 100, 1, (1, 3))]
    assert from_trace(reqs, 4, trace_block=64).prefix_key[0] == \
        from_trace(reqs, 4, trace_block=64).prefix_key[1]
    assert from_trace(reqs, 4, trace_block=32, keys=Keys(blocks=4, block_tokens=16)
                      ).prefix_key[0] != from_trace(reqs, 4, trace_block=32).prefix_key[1]


def test_sessions_grow_and_wait_on_their_previous_turn() -> None:
    spec = Sessions(users=2, turns=3, conversations=3, think=ThinkTime("fixed", 2.0),
                    system_tokens=8, document_tokens=20, question_tokens=4, reply_tokens=8)
    s = sessions(spec, 4)
    assert len(s) == 9
    lengths = [r.prompt_tokens for r in s.blocks]
    assert lengths[:3] == [32, 44, 56]
    assert s.blocks[1].hashes[:8] == s.blocks[0].hashes  # a turn holds the one before
    assert s.blocks[0].hashes[:2] == s.blocks[3].hashes[:2]  # the system blocks are shared
    assert s.blocks[0].hashes[2] != s.blocks[3].hashes[2]
    assert s.after.tolist() == [-1, 0, 1, -1, 3, 4, 2, 6, 7]  # conversation 2 after user 0's
    assert s.think_s.tolist() == [0.0, 2.0, 2.0, 0.0, 2.0, 2.0, 0.0, 2.0, 2.0]


def test_a_paced_think_time_is_refused() -> None:
    with pytest.raises(InputError, match="paced"):
        Sessions(users=1, think=ThinkTime("paced", 0.0, in_flight=1))


def test_a_repeated_trace_is_copies_shifted_past_the_span_sharing_no_block() -> None:
    reqs = [TraceRequest(0, 16, 2, (0, 1)), TraceRequest(1000, 16, 3, (0, 2)),
            TraceRequest(3000, 8, 4, (5,))]
    out = repeated(reqs, 3)
    assert len(out) == 9
    # each copy starts one mean gap (3000 ms / 2) after the last one's end: the rate is kept
    assert [r.timestamp_ms for r in out] == [0, 1000, 3000, 4500, 5500, 7500, 9000, 10000, 12000]
    assert [r.hash_ids for r in out[:3]] == [(0, 1), (0, 2), (5,)]  # the first copy as it is
    assert [r.hash_ids for r in out[3:6]] == [(6, 7), (6, 8), (11,)]  # ids past the largest
    assert [(r.input_length, r.output_length) for r in out[6:]] == [(16, 2), (16, 3), (8, 4)]
    s = from_trace(out, 8, trace_block=8)
    assert s.blocks[0].hashes[:1] == s.blocks[1].hashes[:1]  # within a copy: shared
    assert not set(s.blocks[0].hashes) & set(s.blocks[3].hashes)  # across copies: none
    one = from_trace(reqs, 8, trace_block=8)
    assert (len(s) - 1) / s.span_s() == (len(one) - 1) / one.span_s()  # the mean gap kept
    assert repeated(reqs, 1) == list(reqs)


def test_a_trace_repeat_under_one_is_refused() -> None:
    with pytest.raises(InputError, match="--trace-repeat"):
        repeated([TraceRequest(0, 16, 2, (0, 1))], 0)
