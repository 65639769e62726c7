"""The cache oracle beside a load level: what the engine's prefix cache could have served.

After the level (never while it runs: the client's timing is not disturbed), each request's
exact tokens come from the engine's own `/tokenize` of its messages with the chat template
(vLLM), and the cache's block size and capacity from the engine's `vllm:cache_config_info` as
scraped after the level. The level's requests, warm-up first, are replayed in the order they
were sent through `measure.oracle` (an LRU over whole blocks; vLLM's block hash and eviction
in `oracle`'s docstring), with the level's concurrency, and set against the cached tokens each
response reported. The cache is taken as empty when the level starts: an engine that served
earlier levels may hold more, which shows as requests served above the oracle.

A level gets no oracle, and says why in its row's absence of one, when the engine is not vLLM,
its /metrics has no cache config, or a prompt cannot be tokenized.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from statistics import median

import httpx

from kvlab.engines.vllm import facts as vllm_facts
from kvlab.engines.vllm.adapter import cache_blocks, tokenize_chat
from kvlab.measure import oracle
from kvlab.measure.workloads import Prompt
from kvlab.observe.metrics import Snapshot
from kvlab.records.load import OracleLevel, TierPoint
from kvlab.records.requests import RequestLine

MODEL_WORDS = ("vLLM prefix cache as an LRU over whole blocks, one prompt token always "
               "computed, the requests in flight as measured (the median over the level of "
               "those still running when one was sent); the cache taken as empty when the "
               "level starts; blocks of generated tokens not cached")
IN_FLIGHT = 8  # tokenize calls at once
CURVE = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0)  # tier sizes replayed, in device caches
NULL_BLOCKS = 1


async def tokenized(client: httpx.AsyncClient, root: str, model: str,
                    prompts: Sequence[Prompt]) -> list[list[int]] | None:
    """Every prompt's tokens as the engine counts them (None: one could not be had)."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(p: Prompt) -> list[int] | None:
        async with gate:
            return await tokenize_chat(client, root, model, p.as_messages())

    found = await asyncio.gather(*(one(p) for p in prompts))
    return None if any(t is None for t in found) else [t for t in found if t is not None]


def in_flight(sent: Sequence[RequestLine]) -> int:
    """The median, over requests in sent order, of how many were running when each was sent
    (itself included): what a user-session level holds in flight, which its user count is
    not."""
    counts = [1 + sum(1 for b in sent[:i] if (b.end_s or 0.0) > (a.sent_s or 0.0))
              for i, a in enumerate(sent)]
    return max(1, int(median(counts))) if counts else 1


async def beside(client: httpx.AsyncClient, root: str, model: str, lines: list[RequestLine],
                 prompts: Mapping[int, Prompt], snap: Snapshot | None,
                 tier_blocks: int = 0) -> OracleLevel | None:
    """The oracle for one level's `lines` (each gets its `oracle_cached_tokens`), or None
    when the engine's cache or a request's tokens cannot be known."""
    shape = cache_blocks(snap)
    sent = sorted((ln for ln in lines if ln.sent_s is not None and ln.status == "ok"
                   and ln.prompt_index in prompts), key=lambda ln: ln.sent_s or 0.0)
    if shape is None or not sent:
        return None
    tokens = await tokenized(client, root, model, [prompts[ln.prompt_index or 0] for ln in sent])
    if tokens is None:
        return None
    block, device = shape
    running = in_flight(sent)
    cache = oracle.CacheModel(block, device, tier_blocks, concurrency=running)
    stream = oracle.prepare(tokens, block)
    predicted = oracle.replay(stream, cache)
    unbounded = oracle.infinite_cache(stream, cache)
    for ln, p in zip(sent, predicted, strict=True):
        ln.oracle_cached_tokens = p.cached_tokens
    measured = [(p, ln.cached_tokens, u) for ln, p, u in zip(sent, predicted, unbounded,
                                                             strict=True) if not ln.warmup]
    found = oracle.compare([p for p, _, _ in measured], [m for _, m, _ in measured])
    kept = [i for i, ln in enumerate(sent) if not ln.warmup and ln.cached_tokens is not None]
    sizes = sorted({round(device * x) for x in CURVE})
    points = [TierPoint(tier_blocks=c.tier_blocks, hit_share=c.hit_share)
              for c in oracle.curve(stream, sizes, cache, kept)]
    return OracleLevel(
        cache_model=MODEL_WORDS, block_tokens=block, device_blocks=device,
        tier_blocks=tier_blocks, in_flight=running,
        sizes_from=f"{vllm_facts.CACHE_CONFIG_INFO} after the level",
        tokens_from="the engine's /tokenize of each request's messages, chat template applied",
        requests=found.requests, prompt_tokens=found.prompt_tokens,
        predicted_cached_tokens=found.predicted_tokens,
        measured_cached_tokens=found.measured_tokens,
        infinite_cache_tokens=sum(u.cached_tokens for p, m, u in measured if m is not None),
        above_oracle=found.above_oracle, left_share=found.left_share,
        left_mean_low=found.low, left_mean_high=found.high, tier_curve=points)
