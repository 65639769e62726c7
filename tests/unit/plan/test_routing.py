"""The plan's routers choose as kvlab's proxy and vllm-router's documented rule do."""

from __future__ import annotations

import random

import numpy as np

from kvlab.measure import Blocks
from kvlab.plan.routing import Affinity, CacheAware, LeastOutstanding, replica_names
from kvlab.plan.stream import Stream
from kvlab.proxy import affinity


class _Leg:
    def __init__(self, outstanding: int) -> None:
        self.outstanding = outstanding

    def up(self, now: float) -> bool:
        return True


def test_affinity_picks_what_the_proxys_bounded_choice_picks() -> None:
    rng = random.Random(7)
    for n in (2, 3, 5, 16):
        names = replica_names(n)
        keys = [rng.getrandbits(64) for _ in range(200)]
        router = Affinity(names, keys)
        ring = affinity.Ring(names)
        for i, key in enumerate(keys):
            outstanding = [rng.choice((0, 1, 3, 4, 5, 9)) for _ in range(n)]
            legs = [_Leg(o) for o in outstanding]
            want = affinity.bounded_choice(ring, key, legs, affinity.DEFAULT_LOAD_FACTOR, 0.0)
            assert router.pick(i, outstanding, sum(outstanding)) == want


def test_least_outstanding_breaks_ties_from_the_round_robin_point() -> None:
    router = LeastOutstanding(4)
    picks = [router.pick(i, [1, 0, 0, 2], 3) for i in range(4)]
    # points 0, 1, 2, 3: the first of the fewest (replicas 1 and 2) from there, wrapping
    assert picks == [1, 1, 2, 1]


def _stream(requests: list[tuple[tuple[int, ...], int]]) -> Stream:
    blocks = tuple(Blocks(h, t, 4) for h, t in requests)
    n = len(blocks)
    return Stream(blocks, np.zeros(n), np.ones(n, dtype=np.int64), tuple(range(n)),
                  tuple(range(n)), np.full(n, -1, dtype=np.int64), np.zeros(n), "cache-aware")


def test_cache_aware_follows_a_long_match_and_else_the_smallest_record() -> None:
    s = _stream([((1, 2, 3), 13),       # nothing recorded: the smallest (replica 0)
                 ((7, 8), 9),           # no match: the smallest record is now replica 1's
                 ((1, 2, 9, 10), 17),   # 2 of 4 blocks (8 of 17 tokens, over 0.3): replica 0
                 ((1, 5, 6, 11), 17)])  # 1 block (4 of 17, under 0.3): smallest (replica 1)
    router = CacheAware(2, s)
    picks = [router.pick(i, [0, 0], 0) for i in range(4)]
    assert picks == [0, 1, 0, 1]


def test_cache_aware_balances_once_both_thresholds_are_passed() -> None:
    s = _stream([((1, 2), 9), ((1, 2), 9), ((1, 2), 9)])
    router = CacheAware(2, s)
    assert router.pick(0, [0, 0], 0) == 0
    assert router.pick(1, [64, 0], 64) == 0  # 64 over: not more than the absolute threshold
    assert router.pick(2, [65, 0], 65) == 1  # 65 over and more than 1.5 x: the idlest


def test_loads_keep_the_fewest_and_most_as_min_and_max_would() -> None:
    import random

    from kvlab.plan.routing import Loads

    rng = random.Random(5)
    loads = Loads(7)
    for _ in range(5000):
        r = rng.randrange(7)
        if loads[r] and rng.random() < 0.5:
            loads.dec(r)
        else:
            loads.inc(r)
        assert (loads.fewest, loads.most) == (min(loads), max(loads))
