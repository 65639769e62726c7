"""The cache oracle's terms: the cache being modelled, each request as that cache sees it, and
what the oracle answers for one request.

`CacheModel` is the block size, the device's and the tier's capacities in blocks, how the tier
is filled and whether one prompt token is always computed (the rules themselves are told in
`oracle.py`). A request is its whole blocks' chained hashes (`Blocks`): a prompt given as
tokens is cut into blocks of `block_tokens` and each block named by hash((parent's hash, its
tokens)), so that two blocks are equal only when their whole prefixes are (`block_hashes`,
`hashed`); a Mooncake trace's `hash_ids` are already chained per block and are taken as they
are (`from_hash_ids`, `from_trace`). `Prediction` is one request's answer: its prompt tokens
and those served from the device and from the tier.

Deliberately not here: replaying a stream through the cache and the summaries of a replay
(`oracle.py`, which also prepares a stream), the stack pass (`oracle_stack.py`), and setting
the oracle against what an engine measured (`oracle_gap.py`). Pure Python; no engine is
started or asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from kvlab.core import InputError

ROOT = 0x6B766C6162  # the parent hash of a prompt's first block ("kvlab"); any fixed int works
TierStores = Literal["on_evict", "on_write"]


@dataclass(frozen=True)
class CacheModel:
    """The cache being modelled: block size, capacities in blocks, and its rules."""

    block_tokens: int
    device_blocks: int | None  # None: unbounded
    tier_blocks: int = 0
    tier_stores: TierStores = "on_evict"
    keep_last_token: bool = True
    concurrency: int = 1
    # the tier finds a prefix only in whole chunks of this many blocks from the first token,
    # and keeps chunks (LMCache: 256 tokens, 16 blocks of 16); 1: block by block
    tier_chunk_blocks: int = 1

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise InputError(f"block_tokens {self.block_tokens}: give at least 1 token")
        if self.device_blocks is not None and self.device_blocks < 0:
            raise InputError(f"device_blocks {self.device_blocks}: give 0 or more (or None)")
        if self.tier_blocks < 0:
            raise InputError(f"tier_blocks {self.tier_blocks}: give 0 or more")
        if self.tier_stores not in ("on_evict", "on_write"):
            raise InputError(f"tier_stores {self.tier_stores!r}: on_evict or on_write")
        if self.concurrency < 1:
            raise InputError(f"concurrency {self.concurrency}: give at least 1")
        if self.tier_chunk_blocks < 1:
            raise InputError(f"tier_chunk_blocks {self.tier_chunk_blocks}: give at least 1")
        if self.tier_chunk_blocks > 1 and self.tier_stores != "on_write":
            raise InputError("a tier of chunks is written on every prefill: give "
                             "tier_stores='on_write' with tier_chunk_blocks > 1")

    def servable(self, prompt_tokens: int) -> int:
        """The most leading blocks a prompt of this length can be served from the cache."""
        return max(0, prompt_tokens - int(self.keep_last_token)) // self.block_tokens

    def unbounded(self) -> CacheModel:
        """The same rules with a device that never evicts (the infinite-cache bound)."""
        return replace(self, device_blocks=None, tier_blocks=0)


@dataclass(frozen=True, slots=True)
class Blocks:
    """One request as the cache sees it: its whole blocks' chained hashes, and its length."""

    hashes: tuple[int, ...]
    prompt_tokens: int
    block_tokens: int

    def __post_init__(self) -> None:
        if len(self.hashes) > self.prompt_tokens // self.block_tokens:
            raise InputError(f"{len(self.hashes)} blocks of {self.block_tokens} tokens do not "
                             f"fit in a prompt of {self.prompt_tokens} tokens")


class HashedRequest(Protocol):
    """A trace request: its length and its blocks' ids (`kvlab.loadgen.trace.TraceRequest`)."""

    @property
    def input_length(self) -> int: ...

    @property
    def hash_ids(self) -> Sequence[int]: ...


def block_hashes(tokens: Sequence[int], block_tokens: int, root: int = ROOT) -> list[int]:
    """The chained hash of each whole block of `tokens` (a partial last block has none)."""
    out = []
    parent = root
    for chunk in zip(*[iter(tokens)] * block_tokens, strict=False):  # whole blocks only
        parent = hash((parent, chunk))
        out.append(parent)
    return out


def hashed(tokens: Sequence[int], block_tokens: int) -> Blocks:
    """A prompt given as tokens, as the cache sees it."""
    return Blocks(tuple(block_hashes(tokens, block_tokens)), len(tokens), block_tokens)


def from_hash_ids(hash_ids: Sequence[int], input_length: int, block_tokens: int) -> Blocks:
    """A prompt given as chained block ids (Mooncake's `hash_ids`): its whole blocks' ids."""
    return Blocks(tuple(hash_ids[:input_length // block_tokens]), input_length, block_tokens)


def from_trace(requests: Iterable[HashedRequest], block_tokens: int) -> list[Blocks]:
    """A trace's requests as the cache sees them, no tokens needed."""
    return [from_hash_ids(r.hash_ids, r.input_length, block_tokens) for r in requests]


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the model predicts one request is served from cache, in prompt tokens."""

    prompt_tokens: int
    device_hit_tokens: int
    tier_hit_tokens: int

    @property
    def cached_tokens(self) -> int:
        return self.device_hit_tokens + self.tier_hit_tokens
