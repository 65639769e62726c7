"""The replicas experiment's oracle: each replica's own requests through its own cache, and the
ideal of one cache of N x the blocks, over exact tokens (pure: no engine)."""

from __future__ import annotations

from kvlab.experiments.replicas import NO_ASSIGNMENT, _oracle
from kvlab.records.requests import RequestLine

BLOCK = 4


def lines(n: int) -> list[RequestLine]:
    return [RequestLine(id=i, level=1, prompt_index=i, sent_s=float(i), status="ok")
            for i in range(n)]


def prompts(groups: int, per: int) -> dict[int, list[int]]:
    """`groups` preambles of 4 blocks, each asked `per` times with its own 1-block question."""
    out = {}
    for i in range(groups * per):
        g = i % groups
        out[i] = [1000 * (g + 1) + t for t in range(4 * BLOCK)] + [7 * i + t for t in range(BLOCK)]
    return out


def test_affinity_keeps_what_round_robin_computes_on_every_replica() -> None:
    tokens = prompts(groups=3, per=3)  # 9 requests, request i asks group i % 3
    sent = lines(9)
    together = [i % 3 for i in range(9)]  # each group on its own replica
    spread = [(i // 3) % 3 for i in range(9)]  # each round on another: every replica cold
    affinity, ideal, why = _oracle(sent, tokens, together, (BLOCK, 100), 3)
    scattered, ideal_again, _ = _oracle(sent, tokens, spread, (BLOCK, 100), 3)
    assert why is None and ideal == ideal_again
    # 4 of every 5 blocks are the preamble: 6 of 9 requests find it with affinity
    assert affinity == ideal == round(6 * 16 / (9 * 20), 4)
    assert scattered == 0.0


def test_request_zero_counts_and_an_unknown_assignment_is_said() -> None:
    tokens = prompts(groups=1, per=2)
    share, ideal, why = _oracle(lines(2), tokens, [0, 0], (BLOCK, 100), 2)
    assert share is not None and share > 0 and why is None
    share, ideal, why = _oracle(lines(2), tokens, [None, None], (BLOCK, 100), 2)
    assert share is None and ideal is not None and why == NO_ASSIGNMENT
