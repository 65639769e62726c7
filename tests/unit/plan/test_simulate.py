"""The simulator on cases small enough to count by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.measure import Blocks, CacheModel, oracle
from kvlab.plan.answers import Target, fewest_replicas, highest_rate
from kvlab.plan.routing import POLICIES
from kvlab.plan.simulate import Outcome, simulate
from kvlab.plan.stream import Stream
from kvlab.records import ReplicaProfile

B = 4  # tokens a block


def profile(**given: object) -> ReplicaProfile:
    values: dict[str, object] = {"block_tokens": B, "device_blocks": 1000,
                                 "prefill_s_per_token": 0.001, "decode_step_s": 0.01,
                                 "max_seqs": 8, **given}
    return ReplicaProfile.model_validate(values)


def stream(requests: list[tuple[int, int]], gap_s: float = 10.0, output: int = 1) -> Stream:
    """(conversation, turn) pairs in this order: turn t's prompt is 2 + t whole blocks of the
    conversation's own and one token more, so all of them can be served."""
    blocks = tuple(Blocks(tuple(c * 100 + j for j in range(2 + t)), (2 + t) * B + 1, B)
                   for c, t in requests)
    n = len(requests)
    return Stream(blocks, np.arange(n, dtype=np.float64) * gap_s,
                  np.full(n, output, dtype=np.int64), tuple(c for c, _ in requests),
                  tuple(c for c, _ in requests), np.full(n, -1, dtype=np.int64),
                  np.zeros(n), "by hand")


# 4 conversations of 3 turns, each round in another order, so round-robin over two replicas
# moves every conversation in round 1
ROUNDS = [(c, 0) for c in (0, 1, 2, 3)] + [(c, 1) for c in (1, 2, 3, 0)] \
    + [(c, 2) for c in (2, 3, 0, 1)]


def hit_blocks(policy: str, replicas: int = 2) -> int:
    outcome = simulate(stream(ROUNDS), profile(), replicas, policy)  # type: ignore[arg-type]
    return int(outcome.device_blocks.sum() + outcome.tier_blocks_hit.sum())


def test_round_robin_over_two_replicas_hits_only_the_first_turns_it_kept() -> None:
    # round 0: c0, c2 on replica 0, c1, c3 on 1; round 1 sends each to the other (no hit);
    # round 2 sends each back to its turn-0 replica: 2 blocks each
    assert hit_blocks("round-robin") == 8


def test_conversation_affinity_hits_every_earlier_turn() -> None:
    # every conversation on one replica: round 1 hits 2 blocks each, round 2 hits 3
    assert hit_blocks("conversation-affinity") == 4 * 2 + 4 * 3


def test_one_replica_is_the_oracle() -> None:
    replayed = oracle.replay(stream(ROUNDS).blocks, CacheModel(B, 1000))
    assert sum(p.cached_tokens for p in replayed) == 20 * B
    for policy in POLICIES:
        assert hit_blocks(policy, replicas=1) == 20


def test_requests_per_replica_and_shares_follow_the_assignment() -> None:
    from kvlab.plan.answers import point

    found = point(simulate(stream(ROUNDS), profile(), 2, "round-robin"))
    assert found.requests_per_replica == [6, 6]
    assert found.hit_share == pytest.approx(8 * B / found.prompt_tokens)


def test_arrivals_faster_than_service_make_ttft_grow() -> None:
    # every request 10 tokens, none cached: 0.1 s of prefill, one every 0.05 s
    blocks = tuple(Blocks((i * 10, i * 10 + 1), 10, B) for i in range(8))
    n = len(blocks)
    s = Stream(blocks, np.arange(n) * 0.05, np.ones(n, dtype=np.int64), tuple(range(n)),
               tuple(range(n)), np.full(n, -1, dtype=np.int64), np.zeros(n), "queue")
    ttft = simulate(s, profile(prefill_s_per_token=0.01), 1, "round-robin").ttft_s
    assert ttft.tolist() == pytest.approx([0.1 + 0.05 * k for k in range(n)])


def test_a_full_replica_makes_a_request_wait_for_a_slot_and_batches_slow_decode() -> None:
    blocks = tuple(Blocks((i * 10,), 5, B) for i in range(3))
    s = Stream(blocks, np.zeros(3), np.full(3, 11, dtype=np.int64), (0, 1, 2), (0, 1, 2),
               np.full(3, -1, dtype=np.int64), np.zeros(3), "slots")
    p = profile(prefill_s_per_token=0.0, decode_step_s=0.1, decode_step_per_seq_s=0.05,
                max_seqs=2)
    out = simulate(s, p, 1, "round-robin")
    # the first decodes alone (0.15 s a step), the second beside it (0.2 s); the third waits
    # for the first's last token at 10 x 0.15 s
    assert out.tpot_s.tolist() == pytest.approx([0.15, 0.2, 0.2])
    assert out.ttft_s.tolist() == pytest.approx([0.0, 0.0, 1.5])


def test_a_tier_hit_costs_recall_not_prefill() -> None:
    # one replica holding 2 blocks, a tier of 4: conversation 0's blocks go to the tier
    s = stream([(0, 0), (1, 0), (0, 1)])
    p = profile(device_blocks=2, prefill_s_per_token=0.01, recall_s_per_token=0.001)
    out = simulate(s, p, 1, "round-robin", tier_blocks=4)
    assert out.tier_blocks_hit.tolist() == [0, 0, 2]
    assert out.ttft_s[2] == pytest.approx(2 * B * 0.001 + (3 * B + 1 - 2 * B) * 0.01)


def test_the_highest_rate_grows_with_replicas_and_meets_the_target() -> None:
    blocks = tuple(Blocks((i,), 5, B) for i in range(60))
    n = len(blocks)
    s = Stream(blocks, np.arange(n) * 0.5, np.ones(n, dtype=np.int64), tuple(range(n)),
               tuple(range(n)), np.full(n, -1, dtype=np.int64), np.zeros(n), "rate")
    p = profile(prefill_s_per_token=0.02)  # 0.1 s a request
    target = Target(90, 0.3)
    rates = []

    def run(x: Stream, n_rep: int) -> Outcome:
        return simulate(x, p, n_rep, "round-robin")

    for n_rep in (1, 2, 4):
        answer = highest_rate(s, run, target, "round-robin", n_rep, 0)
        assert answer.rate is not None and answer.ttft_s is not None
        assert answer.ttft_s.p90 is not None and answer.ttft_s.p90 <= 0.3
        rates.append(answer.rate)
    assert rates[0] < rates[1] < rates[2]
    assert 8 < rates[0] < 12  # one replica serves 10 a second


def test_the_fewest_replicas_grow_with_the_rate() -> None:
    blocks = tuple(Blocks((i,), 5, B) for i in range(80))
    n = len(blocks)
    s = Stream(blocks, np.arange(n) * 0.1, np.ones(n, dtype=np.int64), tuple(range(n)),
               tuple(range(n)), np.full(n, -1, dtype=np.int64), np.zeros(n), "fewest")
    p = profile(prefill_s_per_token=0.02)
    def run(x: Stream, n_rep: int) -> Outcome:
        return simulate(x, p, n_rep, "round-robin")

    found = [fewest_replicas(s, run, Target(90, 0.3), "round-robin", 0, rate, 16).replicas
             for rate in (5, 20, 40)]
    assert found[0] == 1 and found[0] is not None and found[1] is not None
    assert found[2] is not None and found[0] <= found[1] <= found[2]
    assert found[2] >= 4


def test_the_fixed_part_of_ttft_is_added_to_every_request_and_holds_no_prefill() -> None:
    base = simulate(stream([(0, 0), (1, 0)], gap_s=0.0), profile(), 1, "round-robin")
    fixed = simulate(stream([(0, 0), (1, 0)], gap_s=0.0), profile(ttft_fixed_s=0.25), 1,
                     "round-robin")
    assert fixed.ttft_s.tolist() == pytest.approx((base.ttft_s + 0.25).tolist())
