"""The cache oracle beside a load level: what the engine's prefix cache could have served.

After the level (never while it runs: the client's timing is not disturbed), the engine's
adapter says which model its cache follows and how large it is (`Engine.cache_shape`), and
gives each request's exact tokens (`Engine.tokenize_chat`: the server's own template and
tokenizer). A block cache (vLLM: its block size and blocks from `vllm:cache_config_info` as
scraped after the level): the level's requests, warm-up first, are replayed in the order they
were sent through `measure.oracle` (an LRU over whole blocks; vLLM's block hash and eviction
in `oracle`'s docstring), with the level's concurrency, and set against the cached tokens each
response reported. The cache is taken as empty when the level starts: an engine that served
earlier levels may hold more, which shows as requests served above the oracle.

Slots (llama-server: the slot count from /props) are replayed by `measure.slot_oracle`, each
request's slot busy from its send to its end as measured.

A level gets no oracle, and says why in its row's absence of one, when the engine states no
cache kvlab can replay (mlx-lm), or a prompt cannot be tokenized.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from statistics import median

import httpx

from kvlab.engines import CacheShape, Engine
from kvlab.measure import Blocks, CacheModel, Prediction, Prompt, oracle, oracle_gap, slot_oracle
from kvlab.observe import Snapshot
from kvlab.records import OracleLevel, RequestLine, TierPoint

MODEL_WORDS = ("vLLM prefix cache as an LRU over whole blocks, one prompt token always "
               "computed, the requests in flight as measured (the median over the level of "
               "those still running when one was sent); the cache taken as empty when the "
               "level starts; blocks of generated tokens not cached")
IN_FLIGHT = 8  # tokenize calls at once
CURVE = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0)  # tier sizes replayed, in device caches
NULL_BLOCKS = 1
SLOT_WORDS = ("llama-server's slots: the longest common prefix, to the token, with the prompt "
              "its slot last held, the slot chosen as the server does (the most similar idle "
              "one above --slot-prompt-similarity 0.5, else the least recently used), one "
              "prompt token always computed, each slot busy from a request's send to its end "
              "as measured; the slots taken as empty when the level starts; generated tokens "
              "and the in-RAM prompt cache (--cache-ram) not modelled, so the engine may "
              "serve more")
Tokenize = Callable[[list[dict[str, str]]], Awaitable[list[int] | None]]


async def tokenized(tokenize: Tokenize, prompts: Sequence[Prompt]) -> list[list[int]] | None:
    """Every prompt's tokens as the engine counts them (None: one could not be had)."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(p: Prompt) -> list[int] | None:
        async with gate:
            return await tokenize(p.as_messages())

    found = await asyncio.gather(*(one(p) for p in prompts))
    return None if any(t is None for t in found) else [t for t in found if t is not None]


def in_flight(sent: Sequence[RequestLine]) -> int:
    """The median, over requests in sent order, of how many were running when each was sent
    (itself included): what a user-session level holds in flight, which its user count is
    not."""
    counts = [1 + sum(1 for b in sent[:i] if (b.end_s or 0.0) > (a.sent_s or 0.0))
              for i, a in enumerate(sent)]
    return max(1, int(median(counts))) if counts else 1


async def beside(client: httpx.AsyncClient, engine: Engine, root: str, model: str,
                 lines: list[RequestLine], prompts: Mapping[int, Prompt], snap: Snapshot | None,
                 tier_tokens: int = 0, curve_tokens: Sequence[int] = ()) -> OracleLevel | None:
    """The oracle for one level's `lines` (each gets its `oracle_cached_tokens`) by the cache
    model the engine's own cache follows (`Engine.cache_shape`), or None when the cache or a
    request's tokens cannot be known. A block cache's tier curve replays `CURVE`'s multiples
    of the device cache and the tiers of `curve_tokens`; a tier of `tier_tokens` sits under
    it."""
    shape = await engine.cache_shape(client, root, snap)
    sent = _sent(lines, prompts)
    if shape is None or not sent:
        return None
    tokens = await tokenized(lambda m: engine.tokenize_chat(client, root, model, m),
                             [prompts[ln.prompt_index or 0] for ln in sent])
    if tokens is None:
        return None
    if shape.kind == "slots":
        return _slots(shape, sent, tokens)
    return _blocks(shape, sent, tokens, tier_tokens // shape.block_tokens, curve_tokens)


def _blocks(shape: CacheShape, sent: list[RequestLine], tokens: list[list[int]],
            tier_blocks: int, curve_tokens: Sequence[int]) -> OracleLevel:
    """The block LRU replayed (vLLM's prefix cache)."""
    block, device = shape.block_tokens, shape.blocks
    running = in_flight(sent)
    cache = CacheModel(block, device, tier_blocks, concurrency=running)
    stream = oracle.prepare(tokens, block)
    predicted = oracle.replay(stream, cache)
    unbounded = oracle.infinite_cache(stream, cache)
    for ln, p in zip(sent, predicted, strict=True):
        ln.oracle_cached_tokens = p.cached_tokens
    measured = [(p, ln.cached_tokens, u) for ln, p, u in zip(sent, predicted, unbounded,
                                                             strict=True) if not ln.warmup]
    found = oracle_gap.compare([p for p, _, _ in measured], [m for _, m, _ in measured])
    points = tier_curve(stream, cache, sent, {round(device * x) for x in CURVE}
                        | {t // block for t in curve_tokens})
    return OracleLevel(
        cache_model=MODEL_WORDS, block_tokens=block, device_blocks=device,
        tier_blocks=tier_blocks, in_flight=running,
        sizes_from=shape.sizes_from,
        tokens_from="the engine's /tokenize of each request's messages, chat template applied",
        requests=found.requests, prompt_tokens=found.prompt_tokens,
        predicted_cached_tokens=found.predicted_tokens,
        measured_cached_tokens=found.measured_tokens,
        infinite_cache_tokens=sum(u.cached_tokens for p, m, u in measured if m is not None),
        above_oracle=found.above_oracle, left_share=found.left_share,
        left_mean_low=found.low, left_mean_high=found.high, tier_curve=points)


def tier_curve(stream: list[Blocks], cache: CacheModel,
               sent: Sequence[RequestLine], sizes: set[int]) -> list[TierPoint]:
    """The hit share at each tier size (blocks) over the level's measured requests, and over
    its returning turns alone where it has any."""
    kept = [i for i, ln in enumerate(sent) if not ln.warmup and ln.cached_tokens is not None]
    later = [i for i in kept if sent[i].turn]
    ordered = sorted(sizes)
    overall = oracle.curve(stream, ordered, cache, kept)
    returning = oracle.curve(stream, ordered, cache, later) if later else [None] * len(ordered)
    return [TierPoint(tier_blocks=c.tier_blocks, hit_share=c.hit_share,
                      returning_hit_share=r.hit_share if r is not None else None)
            for c, r in zip(overall, returning, strict=True)]


def _sent(lines: list[RequestLine], prompts: Mapping[int, Prompt]) -> list[RequestLine]:
    """The level's answered requests with a known prompt, in the order they were sent."""
    return sorted((ln for ln in lines if ln.sent_s is not None and ln.status == "ok"
                   and ln.prompt_index in prompts), key=lambda ln: ln.sent_s or 0.0)


def _slots(shape: CacheShape, sent: list[RequestLine], tokens: list[list[int]]) -> OracleLevel:
    """The slots replayed (llama-server's, `measure.slot_oracle`)."""
    slots = shape.slots
    stream = [slot_oracle.SlotRequest(t, ln.sent_s or 0.0, ln.end_s or ln.sent_s or 0.0)
              for t, ln in zip(tokens, sent, strict=True)]
    served = slot_oracle.replay(stream, slot_oracle.SlotCache(slots))
    bound = slot_oracle.unbounded(stream)
    for ln, n in zip(sent, served, strict=True):
        ln.oracle_cached_tokens = n
    counted = [(Prediction(len(t), n, 0), ln.cached_tokens, b)
               for t, n, b, ln in zip(tokens, served, bound, sent, strict=True) if not ln.warmup]
    found = oracle_gap.compare([p for p, _, _ in counted], [m for _, m, _ in counted])
    return OracleLevel(
        cache_model=SLOT_WORDS, block_tokens=1, device_blocks=0, slots=slots,
        in_flight=in_flight(sent), sizes_from=shape.sizes_from,
        tokens_from="the server's /apply-template and /tokenize of each request's messages",
        requests=found.requests, prompt_tokens=found.prompt_tokens,
        predicted_cached_tokens=found.predicted_tokens,
        measured_cached_tokens=found.measured_tokens,
        infinite_cache_tokens=sum(b for _, m, b in counted if m is not None),
        above_oracle=found.above_oracle, left_share=found.left_share,
        left_mean_low=found.low, left_mean_high=found.high)
