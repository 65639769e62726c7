"""N replicas of one profile behind one router, request by request: which replica each request
goes to, what its cache serves, and when its first and later tokens come.

Each replica's cache is the oracle's (`measure.oracle.Replay`: an LRU of whole blocks, the
profile's device blocks, with a host tier of `tier_blocks` under it filled by evictions),
looked up in the order the replica is sent its requests, one after another. Its time is a
queue, first come first served: a request waits for a free sequence slot (the profile's
`max_seqs`; a slot frees when a request's last token is out) and for the replica's prefill to
be free; its prefill takes the prefill seconds per token not served from cache plus the recall
seconds per token served from the tier; its first token comes at the prefill's end (TTFT: that
minus its arrival, plus the profile's `ttft_fixed_s`, the front end's and the wire's share);
then each further output token takes one decode step at the batch running when its decode
starts (TPOT: a + b x that batch). The router sees each replica's requests in
flight, from arrival to last token.

Arrivals come in time order: a trace's at their stamps, a session's next turn a think time
after its previous turn's last token (known once that turn was simulated), and a closed
loop's next request (`QUEUED`, in the stream's order) at the next last token of any request,
as a load generator's free worker takes the next prompt.

Not here: the stream (`stream.py`), the policies (`routing.py`), and the percentiles and
searches over many runs (`answers.py`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.measure import CacheModel, oracle
from kvlab.plan.routing import LOAD_FACTOR, Loads, Policy, replica_names, router
from kvlab.plan.stream import FIXED, QUEUED, Floats, Ints, Stream
from kvlab.records import ReplicaProfile


@dataclass(frozen=True)
class Outcome:
    """Per request, in the stream's order: its replica, blocks served from the device and
    the tier, arrival, TTFT and TPOT (NaN under two output tokens)."""

    policy: Policy
    replicas: int
    tier_blocks: int
    block_tokens: int
    replica: Ints
    device_blocks: Ints
    tier_blocks_hit: Ints
    prompt_tokens: Ints
    arrival_s: Floats
    ttft_s: Floats
    tpot_s: Floats


def _cache(profile: ReplicaProfile, tier_blocks: int) -> CacheModel:
    return CacheModel(profile.block_tokens, profile.device_blocks, tier_blocks)


class _Replicas:
    """Every replica's cache and clock, and the requests in flight on each."""

    def __init__(self, profile: ReplicaProfile, count: int, tier_blocks: int) -> None:
        cache = _cache(profile, tier_blocks)
        self.caches = [oracle.Replay(cache) for _ in range(count)]
        self.prefill_free = [0.0] * count
        self.running: list[list[float]] = [[] for _ in range(count)]  # end times, a heap each
        self.outstanding = Loads(count)
        self.in_flight = 0
        self.ends: list[tuple[float, int]] = []  # (last token, replica), a heap
        self.profile = profile

    def settle(self, now: float) -> None:
        """Count out the requests whose last token came by `now`."""
        ends, outstanding = self.ends, self.outstanding
        while ends and ends[0][0] <= now:
            outstanding.dec(heapq.heappop(ends)[1])
            self.in_flight -= 1

    def serve(self, r: int, at: float, uncached: int, recalled: int, output: int
              ) -> tuple[float, float, float]:
        """Queue one request on replica `r`: (first token, TPOT, last token)."""
        p = self.profile
        running = self.running[r]
        start = max(at, self.prefill_free[r])
        while running and running[0] <= start:
            heapq.heappop(running)
        if len(running) >= p.max_seqs:  # wait for a slot
            start = heapq.heappop(running)
            while running and running[0] <= start:
                heapq.heappop(running)
        first = start + uncached * p.prefill_s_per_token + recalled * p.recall_s_per_token
        self.prefill_free[r] = first
        while running and running[0] <= first:
            heapq.heappop(running)
        tpot = p.decode_step_s + p.decode_step_per_seq_s * (len(running) + 1)
        last = first + max(output - 1, 0) * tpot
        heapq.heappush(running, last)
        heapq.heappush(self.ends, (last, r))
        self.outstanding.inc(r)
        self.in_flight += 1
        return first, tpot, last


def _arrivals(stream: Stream) -> tuple[list[int], dict[int, list[int]]]:
    """The fixed arrivals in time order (stable), and who waits on whom."""
    after = stream.after
    fixed = np.flatnonzero(after == FIXED)
    order = fixed[np.argsort(stream.arrival_s[fixed], kind="stable")].tolist()
    waiting: dict[int, list[int]] = {}
    for i in np.flatnonzero(after >= 0).tolist():
        waiting.setdefault(int(after[i]), []).append(i)
    return order, waiting


def simulate(stream: Stream, profile: ReplicaProfile, replicas: int, policy: Policy,
             tier_blocks: int | None = None, names: Sequence[str] | None = None,
             load_factor: float = LOAD_FACTOR) -> Outcome:
    """The stream over `replicas` replicas of `profile` routed by `policy`, each replica with
    a tier of `tier_blocks` (None: the profile's); `names` name the replicas on kvlab's ring
    (the proxy's are their URLs)."""
    if len(stream) and stream.block_tokens != profile.block_tokens:
        raise ValueError(f"the stream is in blocks of {stream.block_tokens} tokens; the "
                         f"profile's cache in {profile.block_tokens}")
    tier = profile.tier_blocks if tier_blocks is None else tier_blocks
    names = list(names) if names is not None else replica_names(replicas)
    if len(names) != replicas:
        raise ValueError(f"{len(names)} replica names for {replicas} replicas")
    pick = router(policy, stream, names, load_factor).pick
    state = _Replicas(profile, replicas, tier)
    n, b = len(stream), profile.block_tokens
    replica = [0] * n
    device, tiered, ttft, tpot, arrival = [0] * n, [0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    fixed, waiting = _arrivals(stream)
    queued = np.flatnonzero(stream.after == QUEUED).tolist()  # a closed loop's, in order
    ends: list[float] = []  # every request's last token, while some are queued
    q = 0
    pending: list[tuple[float, int]] = []  # (arrival, request) of turns that waited
    blocks, outputs = stream.blocks, stream.output_tokens.tolist()
    fixed_at, think = stream.arrival_s.tolist(), stream.think_s.tolist()
    caches, outstanding = state.caches, state.outstanding
    k, fixed_s = 0, profile.ttft_fixed_s
    while k < len(fixed) or pending or (q < len(queued) and ends):
        if q < len(queued) and ends and (not pending or ends[0] < pending[0][0]) and (
                k == len(fixed) or ends[0] < fixed_at[fixed[k]]):
            heapq.heappush(pending, (heapq.heappop(ends), queued[q]))  # its turn comes
            q += 1
            continue
        if pending and (k == len(fixed) or pending[0][0] < fixed_at[fixed[k]]):
            at, i = heapq.heappop(pending)
        else:
            i = fixed[k]
            at, k = fixed_at[i], k + 1
        state.settle(at)
        r = pick(i, outstanding, state.in_flight)
        request = blocks[i]
        on_device, on_tier = caches[r].step(request)
        uncached = request.prompt_tokens - (on_device + on_tier) * b
        first, step, last = state.serve(r, at, uncached, on_tier * b, outputs[i])
        replica[i], device[i], tiered[i] = r, on_device, on_tier
        arrival[i], ttft[i] = at, first - at + fixed_s
        tpot[i] = step if outputs[i] > 1 else float("nan")
        for j in waiting.get(i, ()):
            heapq.heappush(pending, (last + think[j], j))
        if q < len(queued):
            heapq.heappush(ends, last)
    return Outcome(policy, replicas, tier, b, np.array(replica, dtype=np.int64),
                   np.array(device, dtype=np.int64), np.array(tiered, dtype=np.int64),
                   np.array([r.prompt_tokens for r in blocks], dtype=np.int64),
                   np.array(arrival, dtype=np.float64), np.array(ttft, dtype=np.float64),
                   np.array(tpot, dtype=np.float64))
