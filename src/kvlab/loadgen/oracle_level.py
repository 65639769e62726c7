"""The cache oracle beside a load level: what the engine's prefix cache could have served.

After the level (never while it runs: the client's timing is not disturbed), the engine's
adapter says which model its cache follows and how large it is (`Engine.cache_shape`), and
gives each request's exact tokens (`Engine.tokenize_chat`: the server's own template and
tokenizer; token ids sent as they were, a trace's or random prompts; text sent to
/v1/completions by its plain /tokenize). A block cache (vLLM: its block size and blocks from
`vllm:cache_config_info` as scraped after the level): the level's requests, warm-up first, are
replayed in the order they were sent through `measure.oracle` (an LRU over whole blocks;
vLLM's block hash and eviction in `oracle`'s docstring), with the level's concurrency, and set
against the cached tokens each response reported. The cache starts holding what this sweep
sent before the level (its earlier levels, `History`), replayed first and not counted: what
the engine held from before the sweep (an earlier run of the same --seed) shows as requests
served above the oracle.

Slots (llama-server: the slot count from /props) are replayed by `measure.slot_oracle`, each
request's slot busy from its send to its end as measured.

A level gets no oracle, and says why on its row (`oracle_absent`) and console, when the engine
states no cache kvlab can replay (mlx-lm), or a prompt cannot be tokenized.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import httpx

from kvlab.core import InputError
from kvlab.engines import CacheShape, Engine
from kvlab.loadgen.workloads import Prompt
from kvlab.measure import (
    Blocks,
    CacheModel,
    Prediction,
    kvmath,
    oracle,
    oracle_gap,
    slot_oracle,
)
from kvlab.observe import Snapshot
from kvlab.records import OracleLevel, RequestLine, TierPoint

MODEL_WORDS = ("vLLM prefix cache as an LRU over whole blocks, one prompt token always "
               "computed, the requests in flight as measured (the median over the level of "
               "those still running when one was sent); the cache taken as holding only what "
               "this sweep sent before the level; blocks of generated tokens not cached")
CHUNK_WORDS = ("; the host tier found from the first token in whole chunks of {} tokens and "
               "written on every prefill (LMCache's)")
IN_FLIGHT = 8  # tokenize calls at once
CURVE = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0)  # tier sizes replayed, in device caches
NULL_BLOCKS = 1
SLOT_WORDS = ("llama-server's slots: the longest common prefix, to the token, with the prompt "
              "its slot last held, the slot chosen as the server does (the most similar idle "
              "one above --slot-prompt-similarity 0.5, else the least recently used), one "
              "prompt token always computed, each slot busy from a request's send to its end "
              "as measured; the slots taken as holding what this sweep sent before the level, "
              "one request at a time; a slot holding its prompt and all but the last generated "
              "token, the generated ones as never matching (their count is the response's, "
              "their ids unknown), so a conversation's next turn may be served more; ")
RAM_WORDS = ("the in-RAM prompt cache under the slots replayed by the server's rules "
             "(measure.slot_oracle: a slot's prompt saved when another takes the slot or idle "
             "slots are saved, the best saved prompt moved back, the oldest dropped past the "
             "limit), a saved token's bytes {per:,.0f} (the KV arithmetic of {model}, K {k}, "
             "V {v}, and {cell} bytes of cell position and sequence)")
CELL_BYTES = 12  # a saved cell's position, sequence count and id (llama.cpp's state_write)
Tokenize = Callable[[int], Awaitable[list[int] | None]]
Sent = Mapping[int, "list[int] | str"]  # what a request sent, by prompt index: ids or text


@dataclass
class History:
    """The tokens of every request a sweep has sent so far, in the order sent: the cache the
    next level starts from."""

    tokens: list[list[int]] = field(default_factory=list)


async def tokenized(tokenize: Tokenize, indices: Sequence[int]) -> list[list[int]] | str:
    """Every prompt's tokens as the engine counts them, or why one could not be had."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(index: int) -> list[int] | None:
        async with gate:
            return await tokenize(index)

    found = await asyncio.gather(*(one(i) for i in indices))
    missing = sum(t is None for t in found)
    if missing:
        return (f"no oracle: the engine's tokenizer endpoint gave no tokens for {missing} of "
                f"{len(found)} prompts (see its log)")
    return [t for t in found if t is not None]


def tokens_of(engine: Engine, client: httpx.AsyncClient, root: str, model: str,
              prompts: Mapping[int, Prompt], sent: Sent) -> tuple[Tokenize, str]:
    """How each request's tokens are had, and the words that say so: the ids it sent, the
    text it sent by the plain /tokenize, else its messages with the chat template."""
    async def tokenize(index: int) -> list[int] | None:
        given = sent.get(index)
        if isinstance(given, list):
            return given
        if isinstance(given, str):
            return await engine.tokenize(client, root, given)
        return await engine.tokenize_chat(client, root, model, prompts[index].as_messages())

    kinds = {type(v) for v in sent.values()}
    words = ("the token ids each request sent" if kinds == {list}
             else "the engine's /tokenize of the text each request sent" if kinds == {str}
             else "the engine's /tokenize of each request's messages, chat template applied")
    return tokenize, words


def in_flight(sent: Sequence[RequestLine]) -> int:
    """The median, over requests in sent order, of how many were running when each was sent
    (itself included): what a user-session level holds in flight, which its user count is
    not."""
    counts = [1 + sum(1 for b in sent[:i] if (b.end_s or 0.0) > (a.sent_s or 0.0))
              for i, a in enumerate(sent)]
    return max(1, int(median(counts))) if counts else 1


async def beside(client: httpx.AsyncClient, engine: Engine, root: str, model: str,
                 lines: list[RequestLine], prompts: Mapping[int, Prompt], snap: Snapshot | None,
                 tier_tokens: int = 0, curve_tokens: Sequence[int] = (), *,
                 sent: Sent | None = None, history: History | None = None,
                 tier_chunk_tokens: int = 0) -> OracleLevel | str | None:
    """The oracle for one level's `lines` (each gets its `oracle_cached_tokens`) by the cache
    model the engine's own cache follows (`Engine.cache_shape`), starting from `history`
    (which then holds this level too); why there is none when a request's tokens cannot be
    had or the engine states no cache; None when nothing was answered. A block cache's tier
    curve replays `CURVE`'s multiples of the device cache and the tiers of `curve_tokens`; a
    tier of `tier_tokens` sits under it, found in chunks of `tier_chunk_tokens` where given."""
    shape = await engine.cache_shape(client, root, snap)
    ordered = _sent(lines, prompts)
    if not ordered:
        return None
    if shape is None:
        return (f"no oracle: the server at {root} states no prefix cache kvlab can replay "
                f"(as {engine.name} would on its /metrics)")
    tokenize, words = tokens_of(engine, client, root, model, prompts, sent or {})
    tokens = await tokenized(tokenize, [ln.prompt_index or 0 for ln in ordered])
    if isinstance(tokens, str):
        return tokens
    before = history.tokens[:] if history is not None else []
    if history is not None:
        history.tokens += tokens
    if shape.kind == "slots":
        return _slots(shape, ordered, tokens, before,
                      words if sent else "the server's /apply-template and /tokenize of each "
                      "request's messages")
    return _blocks(shape, ordered, tokens, tier_tokens // shape.block_tokens, curve_tokens,
                   before, words, tier_chunk_tokens)


def _blocks(shape: CacheShape, sent: list[RequestLine], tokens: list[list[int]],
            tier_blocks: int, curve_tokens: Sequence[int], before: list[list[int]],
            words: str, chunk_tokens: int = 0) -> OracleLevel:
    """The block LRU replayed (vLLM's prefix cache), from what was sent `before`; a tier
    found in chunks of `chunk_tokens` is written on every prefill (LMCache's)."""
    block, device = shape.block_tokens, shape.blocks
    running = in_flight(sent)
    chunk = max(1, chunk_tokens // block)
    cache = CacheModel(block, device, tier_blocks, "on_write" if chunk > 1 else "on_evict",
                       concurrency=running, tier_chunk_blocks=chunk)
    stream = oracle.prepare([*before, *tokens], block)
    skip = len(before)
    predicted = oracle.replay(stream, cache)[skip:]
    unbounded = oracle.infinite_cache(stream, cache)[skip:]
    for ln, p in zip(sent, predicted, strict=True):
        ln.oracle_cached_tokens = p.cached_tokens
    measured = [(p, ln.cached_tokens, u) for ln, p, u in zip(sent, predicted, unbounded,
                                                             strict=True) if not ln.warmup]
    found = oracle_gap.compare([p for p, _, _ in measured], [m for _, m, _ in measured])
    points = tier_curve(stream, cache, sent, {round(device * x) for x in CURVE}
                        | {t // block for t in curve_tokens}, skip)
    return OracleLevel(
        cache_model=MODEL_WORDS + (CHUNK_WORDS.format(chunk * block) if chunk > 1 else ""),
        block_tokens=block, device_blocks=device,
        tier_blocks=tier_blocks, in_flight=running,
        sizes_from=shape.sizes_from, tokens_from=words, earlier_requests=skip or None,
        requests=found.requests, prompt_tokens=found.prompt_tokens,
        predicted_cached_tokens=found.predicted_tokens,
        measured_cached_tokens=found.measured_tokens,
        infinite_cache_tokens=sum(u.cached_tokens for p, m, u in measured if m is not None),
        above_oracle=found.above_oracle, left_share=found.left_share,
        left_mean_low=found.low, left_mean_high=found.high, tier_curve=points)


def tier_curve(stream: list[Blocks], cache: CacheModel,
               sent: Sequence[RequestLine], sizes: set[int], skip: int = 0) -> list[TierPoint]:
    """The hit share at each tier size (blocks) over the level's measured requests (the
    stream's after its first `skip`), and over its returning turns alone where it has any."""
    kept = [skip + i for i, ln in enumerate(sent)
            if not ln.warmup and ln.cached_tokens is not None]
    later = [i for i in kept if sent[i - skip].turn]
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


def _slots(shape: CacheShape, sent: list[RequestLine], tokens: list[list[int]],
           before: list[list[int]], words: str) -> OracleLevel:
    """The slots replayed (llama-server's, `measure.slot_oracle`), after what was sent
    `before`, one at a time ahead of the level's start."""
    slots, start = shape.slots, min((ln.sent_s or 0.0 for ln in sent), default=0.0)
    earlier = [slot_oracle.SlotRequest(t, start - len(before) + i - 1, start - len(before) + i
                                       - 0.5) for i, t in enumerate(before)]
    stream = [slot_oracle.SlotRequest(t, ln.sent_s or 0.0, ln.end_s or ln.sent_s or 0.0,
                                      max(0, (ln.output_tokens or 0) - 1))
              for t, ln in zip(tokens, sent, strict=True)]
    ram, ram_words = ram_cache(shape)
    served = slot_oracle.replay([*earlier, *stream], slot_oracle.SlotCache(slots),
                                ram)[len(earlier):]
    bound = slot_oracle.unbounded([*earlier, *stream])[len(earlier):]
    for ln, n in zip(sent, served, strict=True):
        ln.oracle_cached_tokens = n
    counted = [(Prediction(len(t), n, 0), ln.cached_tokens, b)
               for t, n, b, ln in zip(tokens, served, bound, sent, strict=True) if not ln.warmup]
    found = oracle_gap.compare([p for p, _, _ in counted], [m for _, m, _ in counted])
    return OracleLevel(
        cache_model=SLOT_WORDS + ram_words, block_tokens=1, device_blocks=0, slots=slots,
        ram_cache_bytes=ram.limit_bytes if ram is not None else None,
        ram_cache_note=None if ram is not None else ram_words,
        in_flight=in_flight(sent), sizes_from=shape.sizes_from,
        earlier_requests=len(before) or None, tokens_from=words,
        requests=found.requests, prompt_tokens=found.prompt_tokens,
        predicted_cached_tokens=found.predicted_tokens,
        measured_cached_tokens=found.measured_tokens,
        infinite_cache_tokens=sum(b for _, m, b in counted if m is not None),
        above_oracle=found.above_oracle, left_share=found.left_share,
        left_mean_low=found.low, left_mean_high=found.high)


def ram_cache(shape: CacheShape) -> tuple[slot_oracle.RamCache | None, str]:
    """The in-RAM prompt cache replayed under the slots (None: off, or not known well enough
    to replay), and the words that say which."""
    ram = shape.ram
    if ram is None:
        return None, ("the in-RAM prompt cache not modelled: " + shape.ram_unknown
                      if shape.ram_unknown else oracle_gap.RAM_OFF)
    if ram.model_file is None:
        return None, ("the in-RAM prompt cache not modelled: the server names no model file, "
                      "so a saved token's bytes are not known")
    try:
        kv = kvmath.load_shape(Path(ram.model_file))
        per = kv.split_bytes_per_token(*ram.kv_types) + CELL_BYTES
    except InputError as exc:
        return None, f"the in-RAM prompt cache not modelled: {exc}"
    return (slot_oracle.RamCache(ram.limit_bytes, per, ram.limit_tokens, ram.save_idle,
                                 ram.unified),
            RAM_WORDS.format(per=per, model=Path(ram.model_file).name, k=ram.kv_types[0],
                             v=ram.kv_types[1], cell=CELL_BYTES))
