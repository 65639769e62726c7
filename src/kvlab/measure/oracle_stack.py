"""The cache oracle's stack pass: every request's hit at every capacity from one pass.

One pass over the stream gives each block's LRU stack depth when it is used (Mattson et al.
1970), from which the hit at any capacity follows: where the device and the tier are one LRU
(`_stack_fits`: no eviction at all, or concurrency 1 with a tier filled by evictions, or no
tier), the replay and every point of the tier-size curve come from these depths instead of
moving blocks through the LRUs. A stream whose block lists are not chains (a block used before
following a new one, or twice in one request) has no depths here (None).

Deliberately not here: the block-by-block LRU replay, the choice between the two and the
public replays (`oracle.py`), and the cache's terms (`oracle_model.py`). Pure Python and numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from operator import gt
from typing import cast

import numpy as np
from numpy.typing import NDArray

from kvlab.measure.oracle_model import Blocks, CacheModel

IntArray = NDArray[np.int64]


# --- the stack pass ------------------------------------------------------------------------
# Every whole block a request uses gets a stamp, its root the highest (leaf-first), and an LRU
# of C blocks holds the C blocks with the highest stamps: a block is held iff fewer than C live
# stamps are above its own (its stack depth, Mattson et al. 1970). With on_evict, device and
# tier together are an LRU of device + tier blocks, so one pass over the stream gives every
# request's hit at every capacity. In a chain a parent is always used after its child, so
# depths rise along a request: its hit at capacity C is how many of its blocks are below C.


class _Fenwick:
    """Prefix sums over stamps, one point added at a time."""

    def __init__(self, size: int) -> None:
        self.tree = [0] * (size + 1)

    def add(self, at: int, value: int) -> None:
        i, tree, end = at + 1, self.tree, len(self.tree)
        while i < end:
            tree[i] += value
            i += i & -i

    def upto(self, at: int) -> int:
        """The sum at stamps `at` and below."""
        i, tree, total = at + 1, self.tree, 0
        while i:
            total += tree[i]
            i &= i - 1
        return total


def _runs(old: list[int]) -> list[tuple[int, int]] | None:
    """`old` (a request's blocks' last stamps, in order) as runs of consecutive stamps, each
    (its highest, its length); None unless the stamps fall strictly, as a chain's do."""
    if not all(map(gt, old, islice(old, 1, None))):
        return None
    out, first, n = [], 0, len(old)
    while first < n:
        top, lo, hi = old[first], first + 1, n
        while lo < hi:  # falling strictly, a run's stamps end where they stop falling by one
            mid = (lo + hi) // 2
            if old[mid] == top - (mid - first):
                lo = mid + 1
            else:
                hi = mid
        out.append((top, lo - first))
        first = lo
    return out


@dataclass(frozen=True)
class _Depths:
    """Per request, its leading blocks used before as runs of consecutive stack depths (0:
    the most recently used block): at capacity C it hits sum(clip(C - depth, 0, length))."""

    request: IntArray
    depth: IntArray
    length: IntArray
    servable: IntArray  # per request

    def hits(self, capacity: int | None) -> IntArray:
        """Per request, the blocks an LRU of `capacity` (None: unbounded) serves it."""
        held = self.length if capacity is None else np.clip(capacity - self.depth, 0,
                                                            self.length)
        found = np.bincount(self.request, weights=held, minlength=len(self.servable))
        return np.minimum(np.rint(found).astype(np.int64), self.servable)


def _stack_depths(requests: Sequence[Blocks], cache: CacheModel) -> _Depths | None:
    """The stack pass (None: a request's blocks are not a chain). A superseded run of stamps
    is counted dead at its lowest stamp; no live stamp lies inside a dead run, so the dead
    stamps above a live one are all dead stamps less those at or below it."""
    dead = _Fenwick(sum(len(r.hashes) for r in requests))
    stamp: dict[int, int] = {}
    now = dead_total = 0
    rows: list[tuple[int, int, int]] = []
    for index, r in enumerate(requests):
        hashes, n = r.hashes, len(r.hashes)
        old = list(map(stamp.get, hashes))
        seen = n - old.count(None)
        if seen < n and old.index(None) != seen:  # a block used before after a new one
            return None
        runs = _runs(cast(list[int], old[:seen] if seen < n else old))
        if runs is None:
            return None
        rows += [(index, now - 1 - top - dead_total + dead.upto(top), m) for top, m in runs]
        for top, m in runs:
            dead.add(top - m + 1, m)
            dead_total += m
        known = len(stamp)
        stamp.update(zip(hashes, range(now + n - 1, now - 1, -1), strict=True))
        if len(stamp) - known != n - seen:  # a block twice in one request
            return None
        now += n
    table = np.array(rows, dtype=np.int64).reshape(len(rows), 3)
    servable = np.array([cache.servable(r.prompt_tokens) for r in requests], dtype=np.int64)
    return _Depths(table[:, 0], table[:, 1], table[:, 2], servable)


def _stack_fits(cache: CacheModel) -> bool:
    """Whether `cache` is one LRU to the stack pass: no eviction at all, or sequential with a
    tier filled by evictions (or none)."""
    return cache.device_blocks is None or (
        cache.concurrency == 1 and (cache.tier_stores == "on_evict" or not cache.tier_blocks))
