"""The plan's prediction for `kvlab run replicas`' own arms: the arm's prompts as the plan's
stream (exact tokens, the proxy's keys, the closed loop), simulated over the replicas' URLs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvlab.core import InputError
from kvlab.experiments import replicas_plan
from kvlab.loadgen import Prompt
from kvlab.plan import closed_loop, simulate
from kvlab.plan.stream import FIXED, QUEUED
from kvlab.proxy import affinity
from kvlab.records import ReplicaProfile

B = 16
URLS = ["http://127.0.0.1:8101", "http://127.0.0.1:8102", "http://127.0.0.1:8103"]
PROFILE = ReplicaProfile(block_tokens=B, device_blocks=10_000, prefill_s_per_token=0.0001,
                         decode_step_s=0.01, max_seqs=4)


def shared(n: int, groups: int) -> tuple[list[Prompt], dict[int, list[int]]]:
    """n prompts over `groups` preambles of 4 blocks, each with one block of its own."""
    prompts = [Prompt(i, (("system", f"preamble {i % groups}"), ("user", f"question {i}")))
               for i in range(n)]
    tokens = {i: [1000 * (i % groups) + j for j in range(4 * B)]
              + [10**6 + 100 * i + j for j in range(B + 3)] for i in range(n)}
    return prompts, tokens


def test_the_closed_loop_sends_the_next_prompt_in_order_as_any_request_ends() -> None:
    prompts, tokens = shared(7, 2)
    s = closed_loop(prompts, tokens, B, 3, 4, None, "test")
    assert s.after.tolist() == [FIXED] * 3 + [QUEUED] * 4
    assert s.output_tokens.tolist() == [4] * 7
    assert [b.prompt_tokens for b in s.blocks] == [5 * B + 3] * 7
    assert s.conversation_key[0] == affinity.conversation_key(
        {"messages": prompts[0].as_messages()})
    # request 1 is long, so requests 0 and 2 end first: 3 and 4 go as they end, in order
    out = [2, 40, 2, 2, 2, 2, 2]
    s = replace(s, output_tokens=np.array(out, dtype=np.int64))
    o = simulate(s, PROFILE, 1, "round-robin")
    arrival = o.arrival_s.tolist()
    assert arrival[:3] == [0.0, 0.0, 0.0]
    assert arrival == sorted(arrival)  # in the stream's order, as the load generator sends
    assert arrival[3] > 0 and arrival[6] < arrival[1] + o.ttft_s[1] + 39 * o.tpot_s[1]


def test_round_robin_spreads_evenly_and_finds_each_preamble_on_each_replica_once() -> None:
    prompts, tokens = shared(18, 6)
    point = replicas_plan.predict(PROFILE, "round-robin", URLS, prompts, tokens, 2, 4, None,
                                  1.25)
    assert point.requests_per_replica == [6, 6, 6]
    # 6 preambles, each reaching its replica (18 = 3 x 6: request i on replica i % 3,
    # preamble i % 6: each replica sees 2 preambles, 3 times each): 2 of 3 requests hit 4 blocks
    assert point.hit_share == pytest.approx(12 * 4 * B / (18 * (5 * B + 3)), abs=1e-6)
    assert point.ttft_s is not None and point.ttft_s.p50 is not None


def test_a_prompt_the_replica_could_not_tokenize_is_named() -> None:
    prompts, tokens = shared(4, 2)
    del tokens[2]
    with pytest.raises(InputError, match="prompt 2"):
        closed_loop(prompts, tokens, B, 2, 4, None, "test")
