"""The routing policies a plan compares, each choosing as its router does.

kvlab's proxy (`proxy/legs.py`, `proxy/affinity.py`), with every replica up:

- round-robin: the next replica in turn;
- least-outstanding: the replica with the fewest requests in flight, ties broken from the
  round-robin point (which moves on with every request);
- prefix-affinity and conversation-affinity: the request's key on the proxy's own ring
  (`affinity.Ring`, named by the replicas' URLs), the first replica from it within the load
  bound (`affinity.load_bound`, over the requests in flight counting this one); the keys are
  the stream's (`stream.py`).

vllm-router's `cache_aware` (`vllm-router:cache_aware`, as `kvlab run replicas` names the arm; its
documented rule, the defaults of 0.1.17's `--cache-threshold`
0.3, `--balance-abs-threshold` 64 and `--balance-rel-threshold` 1.5): while the busiest
replica has more than 64 requests in flight over the idlest and more than 1.5 times as many,
the idlest (the lowest-numbered of those tied); else the replica whose record of past requests
shares the longest prefix with this one, if that prefix is over 0.3 of the prompt, else the
replica with the smallest record; the prompt then joins the chosen replica's record. The record
here is a set of whole blocks, never trimmed: vllm-router's is a tree of characters trimmed to
2^25 characters a replica every 120 s, its match counts characters (part of a block too), and
its choice among tied replicas is not documented (here the lowest-numbered).

Every policy sees the same `outstanding` list (requests in flight per replica) the simulator
keeps; `pick` returns a replica's index.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import takewhile
from typing import Final, Literal, Protocol

from kvlab.plan.stream import Stream
from kvlab.proxy import BALANCES, Balance, affinity

CACHE_AWARE: Final = "vllm-router:cache_aware"  # as `kvlab run replicas` names the arm
Policy = Literal[Balance, "vllm-router:cache_aware"]
POLICIES: tuple[Policy, ...] = (*BALANCES, CACHE_AWARE)
CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5
LOAD_FACTOR = affinity.DEFAULT_LOAD_FACTOR


class Loads(list[int]):
    """Requests in flight per replica, with the fewest and most kept as they change (a count
    of replicas at each load): `min` and `max` over hundreds of replicas per request were a
    quarter of `cache_aware`'s time. Changed only through `inc` and `dec`."""

    def __init__(self, replicas: int) -> None:
        super().__init__([0] * replicas)
        self.at = [replicas]  # at[v]: replicas with v in flight
        self.fewest = 0
        self.most = 0

    def inc(self, r: int) -> None:
        v = self[r]
        self[r] = v + 1
        at = self.at
        at[v] -= 1
        if v + 1 == len(at):
            at.append(0)
        at[v + 1] += 1
        if v + 1 > self.most:
            self.most = v + 1
        if v == self.fewest and not at[v]:
            self.fewest = v + 1

    def dec(self, r: int) -> None:
        v = self[r]
        self[r] = v - 1
        at = self.at
        at[v] -= 1
        at[v - 1] += 1
        if v - 1 < self.fewest:
            self.fewest = v - 1
        if v == self.most and not at[v]:
            self.most = v - 1


def _extremes(outstanding: list[int]) -> tuple[int, int]:
    """(fewest, most) in flight on any replica."""
    if isinstance(outstanding, Loads):
        return outstanding.fewest, outstanding.most
    return min(outstanding), max(outstanding)


class Router(Protocol):
    def pick(self, index: int, outstanding: list[int], in_flight: int) -> int:
        """The replica for request `index`, given the requests in flight on each replica and
        in all (before this one)."""
        ...


class RoundRobin:
    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.next = 0

    def pick(self, index: int, outstanding: list[int], in_flight: int) -> int:
        i = self.next
        self.next = (i + 1) % self.replicas
        return i


class LeastOutstanding(RoundRobin):
    def pick(self, index: int, outstanding: list[int], in_flight: int) -> int:
        start = super().pick(index, outstanding, in_flight)
        fewest = _extremes(outstanding)[0]
        try:
            return outstanding.index(fewest, start)
        except ValueError:
            return outstanding.index(fewest)


class Affinity:
    def __init__(self, names: Sequence[str], keys: Sequence[int],
                 load_factor: float = LOAD_FACTOR) -> None:
        self.ring = affinity.Ring(names)
        self.keys = keys
        self.replicas = len(names)
        self.load_factor = load_factor

    def pick(self, index: int, outstanding: list[int], in_flight: int) -> int:
        key = self.keys[index]
        if self.replicas == 1:
            return 0
        bound = affinity.load_bound(in_flight + 1, self.replicas, self.load_factor)
        seen = []
        for i in self.ring.owners_from(key):
            if outstanding[i] + 1 <= bound:
                return i
            seen.append(i)
        return min(seen, key=outstanding.__getitem__)  # never, with every replica up


class CacheAware:
    def __init__(self, replicas: int, stream: Stream) -> None:
        self.stream = stream
        self.holders: dict[int, set[int]] = {}  # block -> the replicas whose record has it
        self.size = [0] * replicas  # blocks in each replica's record
        self.smallest = [(0, r) for r in range(replicas)]  # (size, replica), a heap, stale
        # entries put right when read (sizes only grow)

    def pick(self, index: int, outstanding: list[int], in_flight: int) -> int:
        request = self.stream.blocks[index]
        hashes = request.hashes
        matched = len(list(takewhile(self.holders.__contains__, hashes)))
        chosen = -1
        if in_flight > BALANCE_ABS:  # else no two replicas can differ by more
            fewest, most = _extremes(outstanding)
            if most - fewest > BALANCE_ABS and most > BALANCE_REL * fewest:
                chosen = outstanding.index(fewest)
        if chosen < 0:
            chosen = self._matched(hashes, matched, request.prompt_tokens,
                                   request.block_tokens)
        self._record(hashes, matched, chosen)
        return chosen

    def _matched(self, hashes: tuple[int, ...], matched: int, prompt_tokens: int,
                 block_tokens: int) -> int:
        """A record holds whole prompts from their first block and is never trimmed, so the
        replicas holding a request's k-th block hold all before it: the longest match ends at
        the last block anyone holds (`matched` blocks), and they are the replicas holding it."""
        if matched and matched * block_tokens > CACHE_THRESHOLD * prompt_tokens:
            return min(self.holders[hashes[matched - 1]])
        heap, size = self.smallest, self.size
        while heap[0][0] != size[heap[0][1]]:  # grown since: back in at its size
            heapq.heapreplace(heap, (size[heap[0][1]], heap[0][1]))
        return heap[0][1]  # the smallest, the lowest-numbered of those tied

    def _record(self, hashes: tuple[int, ...], matched: int, chosen: int) -> None:
        """The prompt joins `chosen`'s record: of the `matched` blocks others hold, those it
        lacks; the rest no one holds yet."""
        holders = self.holders
        added = 0
        if not (matched and chosen in holders[hashes[matched - 1]]):
            for h in hashes[:matched]:
                found = holders[h]
                if chosen not in found:
                    found.add(chosen)
                    added += 1
        new = hashes[matched:]
        if any(map(holders.__contains__, new)):  # not a chain: block by block
            for h in new:
                found = holders.setdefault(h, set())
                if chosen not in found:
                    found.add(chosen)
                    added += 1
        else:
            holders.update(zip(new, ({chosen} for _ in new), strict=True))
            added += len(new)
        self.size[chosen] += added


def router(policy: Policy, stream: Stream, names: Sequence[str],
           load_factor: float = LOAD_FACTOR) -> Router:
    """The policy's router over replicas named `names` (kvlab's ring places them by name)."""
    n = len(names)
    if policy == "round-robin":
        return RoundRobin(n)
    if policy == "least-outstanding":
        return LeastOutstanding(n)
    if policy == "prefix-affinity":
        return Affinity(names, stream.prefix_key, load_factor)
    if policy == "conversation-affinity":
        return Affinity(names, stream.conversation_key, load_factor)
    if policy == CACHE_AWARE:
        return CacheAware(n, stream)
    raise ValueError(f"no policy {policy!r}: {', '.join(POLICIES)}")


def replica_names(count: int) -> list[str]:
    """The names a ring places replicas by when no URLs are given (the proxy's are URLs)."""
    return [f"http://replica-{i}" for i in range(count)]
