"""A cache oracle: how many prompt tokens an engine's prefix cache could have served, per
request, from a model of that cache replayed over the exact requests in the order they were
sent. Pure Python; no engine is started or asked.

The model (vLLM-style automatic prefix caching, whole blocks only):

- A prompt is cut into blocks of `block_tokens`; only whole blocks are cached, so a partial last
  block never hits. A block is named by a chained hash, hash((parent's hash, its tokens)), so
  two blocks are equal only when their whole prefixes are (`block_hashes`). Python's hash of a
  tuple of ints does not depend on PYTHONHASHSEED: the names are the same in every process of
  one Python version (64 bits: two prefixes share one by chance once in ~10^19 pairs).
  Mooncake traces' `hash_ids` are already chained per block and are taken as they are
  (`from_trace`). Other lists are replayed too, with only the prefix semantics they carry.
- A request's hit is its longest run of leading blocks held on the device, continued in the
  tier. With `keep_last_token` (default) one prompt token is always computed, as vLLM does to
  get logits: it looks up at most the first `prompt_tokens - 1` tokens, so a prompt that is all
  hit and a whole number of blocks long has its last block recomputed. Without it a prompt may
  be served whole.
- The device is an LRU over blocks of `device_blocks` (None: unbounded, `infinite_cache`).
  Every whole block of a request is used by it: its hits are touched, the rest are computed
  and inserted, and all of them become the most recently used, the request's last block
  first, so that of one request's blocks its tail is evicted first (vLLM frees a finished
  request's blocks in reverse order: leaf-first among equals).
- When the device is over its capacity its least recently used blocks are evicted. With a
  tier (`tier_blocks` > 0, itself an LRU) and `tier_stores="on_evict"` an evicted block moves
  into the tier; a block found there is a tier hit and moves back to the device (which may
  evict others into the tier); a block evicted from the tier is gone. The device and the tier
  never hold the same block, and together they hold exactly what one LRU of
  `device_blocks + tier_blocks` would. With `"on_write"` every block a request computes or
  loads from the tier is written (or touched) in the tier, and the device's evictions are
  dropped, as LMCache and vLLM's OffloadingConnector store on every prefill. The device never
  depends on the tier, so, either way, a bigger tier never serves a request less (it sees the
  same writes, evictions and promotions whatever its size): the tier-size curve (`curve`)
  never falls. With on_write a bigger device can serve less in all (the tier sees other
  writes).
- A tier of chunks (`tier_chunk_blocks` > 1, on_write; LMCache's 256-token chunks) holds a
  request's whole chunks, each named by its last block's chained hash, and is looked up from
  the first token, whatever the device holds: it serves the blocks its leading chunks reach
  beyond the device's hit, and nothing when they reach no further.
- Sequential replay: each request completes before the next is looked up. With
  `concurrency` c > 1 a request arrives while the c - 1 before it run: their blocks are in use
  and cannot be evicted (the device may go over its capacity while in-flight blocks alone
  exceed it, where an engine would queue or preempt). The model lets an in-flight request
  finish its prefill before the next one's lookup. With c > 1 device and tier are no longer
  exactly one LRU (a block promoted while in-flight blocks fill the device pushes nothing
  into the tier).

Where real engines differ:

- vLLM evicts only free blocks, lazily when it allocates; blocks holding generated tokens are
  cached too (a next turn that repeats the answer token for token hits them; here it does not),
  and its block hash also covers LoRA, multimodal inputs and `cache_salt`. Eviction here runs
  once after each request.
- LMCache keeps a prompt's trailing partial chunk too (a repeat of the very same prompt can
  find it) and serves at most the prompt less one token, not less one block.
- llama-server's cache is per slot: a request reuses the longest common prefix, in tokens, with
  the prompt its slot last held (recent versions can also keep whole prompts in a host-RAM
  prompt cache, `--cache-ram`). `block_tokens=1` approximates token-granular matching, but an LRU
  over tokens keeps pieces of many prompts where a slot keeps one: read it as a bound.

Two replays give the same figures: `replay_lru` moves blocks through the LRUs one by one, in
every mode; `replay` (and `summarize`, `curve`) takes a stack pass where it applies (on_evict
or no tier, concurrency 1: device and tier are then one LRU): every block's LRU stack depth
once, from which the hit at every capacity follows. A stream whose block lists are not chains
(a block used before following a new one, or twice in one request) falls back to block by
block. Hashing is the slower half.

Not here: the cache's terms and a request's blocks (`oracle_model.py`), the stack pass
(`oracle_stack.py`), and the oracle against what an engine reported (`oracle_gap.py`: the reuse
left on the table, oracle minus measured).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice, repeat, takewhile

import numpy as np

from kvlab.core import InputError
from kvlab.measure.oracle_model import Blocks, CacheModel, Prediction, hashed
from kvlab.measure.oracle_stack import IntArray, _Depths, _stack_depths, _stack_fits
from kvlab.records import Strict

Lru = OrderedDict[int, None]


def prepare(stream: Iterable[Blocks | Sequence[int]], block_tokens: int) -> list[Blocks]:
    """Each request as `Blocks`: token lists hashed, `Blocks` checked for their block size."""
    out = [r if isinstance(r, Blocks) else hashed(r, block_tokens) for r in stream]
    for r in out:
        if r.block_tokens != block_tokens:
            raise InputError(f"a request was hashed in blocks of {r.block_tokens} tokens; "
                             f"the cache's blocks are {block_tokens}")
    return out


# --- the replay -----------------------------------------------------------------------------

def _consume(calls: Iterator[object]) -> None:
    deque(calls, maxlen=0)  # runs a map() of C methods without a Python-level loop


def _run(held: Lru, hashes: tuple[int, ...], start: int) -> int:
    """How many of `hashes`, from `start`, are held one after another."""
    return len(list(takewhile(held.__contains__, hashes[start:] if start else hashes)))


def _refresh(lru: Lru, hashes: Sequence[int]) -> None:
    """`hashes` become the most recently used, the last one first (leaf-first eviction)."""
    _consume(map(lru.pop, hashes, repeat(None)))
    lru.update(dict.fromkeys(reversed(hashes)))


def _trim(lru: Lru, capacity: int) -> list[int]:
    """Evict the least recently used until `lru` fits `capacity`; returns what went."""
    gone = list(islice(lru, max(0, len(lru) - capacity)))
    _consume(map(lru.__delitem__, gone))
    return gone


class Replay:
    """The device and tier as one request after another leaves them: the one LRU every
    replay here moves blocks through, and the cache of each replica `kvlab plan` simulates
    (`step` per request, in the order the replica is sent them)."""

    def __init__(self, cache: CacheModel) -> None:
        self.cache = cache
        self.device: Lru = OrderedDict()
        self.tier: Lru = OrderedDict()
        self.last_use: dict[int, int] = {}  # block -> the last request that used it (c > 1)
        self.index = 0

    def step(self, request: Blocks) -> tuple[int, int]:
        """Look one request up, then leave the cache as it leaves it: (device, tier) blocks
        served."""
        hashes = request.hashes
        on_device = _run(self.device, hashes, 0)
        m = self.cache.tier_chunk_blocks
        if m > 1:  # whole chunks from the first token: what they reach past the device
            on_tier = max(0, _run(self.tier, hashes[m - 1::m], 0) * m - on_device)
        else:
            on_tier = _run(self.tier, hashes, on_device) if self.tier else 0
        served = min(on_device + on_tier, self.cache.servable(request.prompt_tokens))
        device_hit = min(on_device, served)
        self._use(hashes, on_device, device_hit)
        self._evict()
        self.index += 1
        return device_hit, served - device_hit

    def _use(self, hashes: tuple[int, ...], on_device: int, device_hit: int) -> None:
        m = self.cache.tier_chunk_blocks
        if m > 1 and self.cache.tier_blocks:  # every whole chunk, found or computed
            _refresh(self.tier, hashes[m - 1::m])
            _trim(self.tier, self.cache.tier_blocks // m)
        elif self.cache.tier_stores == "on_write" and self.cache.tier_blocks:
            _refresh(self.tier, hashes[device_hit:])  # what it loaded or computed is written
            _trim(self.tier, self.cache.tier_blocks)
        elif self.tier:
            _consume(map(self.tier.pop, hashes[on_device:], repeat(None)))  # back on device
        # the hits' blocks stay in place but for their order; the rest arrive, tail first
        tail = hashes[on_device:]
        _consume(map(self.device.pop, tail, repeat(None)))  # none with chained hashes
        self.device.update(dict.fromkeys(reversed(tail)))
        _consume(map(self.device.move_to_end, reversed(hashes[:on_device])))
        if self.cache.concurrency > 1:
            self.last_use.update(dict.fromkeys(hashes, self.index))

    def _evict(self) -> None:
        capacity = self.cache.device_blocks
        if capacity is None or len(self.device) <= capacity:
            return
        if self.cache.concurrency == 1:
            gone = _trim(self.device, capacity)
        else:
            gone = self._evict_free(capacity)
        if self.cache.tier_stores == "on_evict" and self.cache.tier_blocks:
            self.tier.update(dict.fromkeys(gone))
            _trim(self.tier, self.cache.tier_blocks)

    def _evict_free(self, capacity: int) -> list[int]:
        """Evict the least recently used blocks no in-flight request holds: those of this
        request and the c - 2 before it, which the next request finds still running."""
        floor = self.index - self.cache.concurrency + 2
        last = self.last_use
        free = (h for h in self.device if last[h] < floor)  # in-flight blocks are recent
        gone = list(islice(free, len(self.device) - capacity))
        _consume(map(self.device.__delitem__, gone))
        return gone

def _by_stack(depths: _Depths, cache: CacheModel) -> tuple[IntArray, IntArray]:
    device = depths.hits(cache.device_blocks)
    both = None if cache.device_blocks is None else cache.device_blocks + cache.tier_blocks
    return device, depths.hits(both) - device


def _by_lru(requests: Sequence[Blocks], cache: CacheModel) -> tuple[IntArray, IntArray]:
    replayed = Replay(cache)
    pairs = np.array([replayed.step(r) for r in requests], dtype=np.int64)
    pairs = pairs.reshape(len(requests), 2)
    return pairs[:, 0], pairs[:, 1]


def _hit_blocks(requests: Sequence[Blocks], cache: CacheModel,
                depths: _Depths | None) -> tuple[IntArray, IntArray]:
    """Per request, the (device, tier) blocks served: by the stack pass where it applies and
    `depths` were found, else block by block."""
    if depths is not None and _stack_fits(cache):
        return _by_stack(depths, cache)
    return _by_lru(requests, cache)


def _depths_for(requests: Sequence[Blocks], cache: CacheModel) -> _Depths | None:
    return _stack_depths(requests, cache) if _stack_fits(cache) else None


def _predictions(requests: Sequence[Blocks], hits: tuple[IntArray, IntArray],
                 block_tokens: int) -> list[Prediction]:
    device, tier = (h.tolist() for h in hits)
    return [Prediction(r.prompt_tokens, d * block_tokens, t * block_tokens)
            for r, d, t in zip(requests, device, tier, strict=True)]


def replay(stream: Iterable[Blocks | Sequence[int]], cache: CacheModel) -> list[Prediction]:
    """Per request, in order, what the cache serves it (token lists are hashed first)."""
    requests = prepare(stream, cache.block_tokens)
    hits = _hit_blocks(requests, cache, _depths_for(requests, cache))
    return _predictions(requests, hits, cache.block_tokens)


def replay_lru(stream: Iterable[Blocks | Sequence[int]], cache: CacheModel
               ) -> list[Prediction]:
    """`replay` block by block through the LRUs, in every mode (`replay` takes the stack pass
    where it gives the same figures, faster)."""
    requests = prepare(stream, cache.block_tokens)
    return _predictions(requests, _by_lru(requests, cache), cache.block_tokens)


# --- summaries ------------------------------------------------------------------------------

def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


class Summary(Strict):
    """A stream's prompt tokens, what the cache serves of them, and what an unbounded device
    would (the same rules, nothing ever evicted)."""

    cache: CacheModel
    requests: int
    prompt_tokens: int
    device_hit_tokens: int
    tier_hit_tokens: int
    cached_tokens: int
    hit_share: float | None  # of prompt tokens (None: no prompt tokens)
    infinite_cache_tokens: int
    infinite_cache_share: float | None


def summarize(stream: Iterable[Blocks | Sequence[int]], cache: CacheModel) -> Summary:
    """The stream replayed through `cache` and through an unbounded one."""
    requests = prepare(stream, cache.block_tokens)
    depths = _stack_depths(requests, cache)  # the unbounded replay always fits the pass
    b = cache.block_tokens
    device, tier = (int(h.sum()) * b for h in _hit_blocks(requests, cache, depths))
    infinite = sum(int(h.sum()) for h in _hit_blocks(requests, cache.unbounded(), depths)) * b
    prompt = sum(r.prompt_tokens for r in requests)
    return Summary(cache=cache, requests=len(requests), prompt_tokens=prompt,
                   device_hit_tokens=device, tier_hit_tokens=tier, cached_tokens=device + tier,
                   hit_share=_share(device + tier, prompt), infinite_cache_tokens=infinite,
                   infinite_cache_share=_share(infinite, prompt))


def infinite_cache(stream: Iterable[Blocks | Sequence[int]], cache: CacheModel
                   ) -> list[Prediction]:
    """Per request, what a device that never evicts would serve under `cache`'s rules."""
    return replay(stream, cache.unbounded())


@dataclass(frozen=True)
class CurvePoint:
    """The stream's cached tokens, and their share of its prompt tokens, at one tier size."""

    tier_blocks: int
    cached_tokens: int
    hit_share: float | None


def curve(stream: Iterable[Blocks | Sequence[int]], sizes: Sequence[int], cache: CacheModel,
          counted: Sequence[int] | None = None) -> list[CurvePoint]:
    """The hit share at each tier size (blocks), `cache`'s device and rules otherwise, over
    the requests at `counted` (None: all; the others are replayed but not counted, as a
    warm-up is): one stack pass for all sizes where it applies (on_evict, concurrency 1),
    else one replay per size; the stream is hashed once."""
    requests = prepare(stream, cache.block_tokens)
    kept = list(range(len(requests))) if counted is None else list(counted)
    prompt = sum(requests[i].prompt_tokens for i in kept)
    depths = _depths_for(requests, cache)
    out = []
    for size in sizes:
        hits = _hit_blocks(requests, replace(cache, tier_blocks=size), depths)
        cached = sum(int(h[kept].sum()) for h in hits) * cache.block_tokens
        out.append(CurvePoint(size, cached, _share(cached, prompt)))
    return out
