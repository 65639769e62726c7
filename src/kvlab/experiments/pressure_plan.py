"""Finding the pressure point: a KV cache too small for the workload's working set.

A host-memory tier does nothing until blocks are evicted and wanted again. The workload that
wants them again is users who come back: user sessions (`loadgen.sessions`), each user's next
turn sent after its reply and a think time, during which the other users' turns push its
blocks out. This module sizes the device cache to hold the concurrent requests comfortably,
and the user population so that their live conversations (the working set) are several times
the cache: a returning turn then finds its blocks evicted (recomputed without a tier, recalled
with one). It also says how large a host tier must be so that no returning conversation is
lost: the whole working set, since vLLM's host tier keeps a copy of every block it stores
whether or not the device still holds it; a tier smaller than that is known as such. Pure
arithmetic; the run records the pressure actually reached beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kvlab.measure import workloads
from kvlab.records.load import PressurePlanned

TURNS = workloads.DEFAULT_TURNS
HEADROOM = 1.5  # the cache holds this many times the concurrent requests' tokens
OVERSUBSCRIPTION = 3.0  # the working set is at least this many times the cache


@dataclass(frozen=True)
class PressurePlan:
    concurrency: int
    requests: int
    conversations: int
    conversation_tokens: int
    working_set_tokens: int
    cache_tokens: int
    kv_cache_bytes: int
    bytes_per_token: float
    reusable_fraction: float  # of prompt tokens, were nothing evicted
    preamble_tokens: int  # the workload's size, fitted to the context
    users: int = 0  # live at once, one conversation each: the working set's conversations
    turns: int = TURNS

    @property
    def oversubscription(self) -> float:
        return self.working_set_tokens / self.cache_tokens

    @property
    def tier_tokens_needed(self) -> int:
        """What a host tier must hold so that no evicted conversation is lost: the working
        set (the tier is inclusive: it copies what it stores, the device keeps its own)."""
        return self.working_set_tokens

    @property
    def tier_bytes_needed(self) -> int:
        return math.ceil(self.tier_tokens_needed * self.bytes_per_token)

    def tier_gb(self, asked_gb: float) -> float:
        """The host tier to start: what was asked, raised to hold the working set (whole
        GiB)."""
        return max(asked_gb, float(math.ceil(self.tier_bytes_needed / 2**30)))

    def as_record(self) -> PressurePlanned:
        return PressurePlanned(
            concurrency=self.concurrency, requests=self.requests,
            conversations=self.conversations, conversation_tokens=self.conversation_tokens,
            working_set_tokens=self.working_set_tokens, cache_tokens=self.cache_tokens,
            kv_cache_bytes=self.kv_cache_bytes, bytes_per_token=self.bytes_per_token,
            reusable_fraction=self.reusable_fraction, preamble_tokens=self.preamble_tokens,
            users=self.users, turns=self.turns,
            oversubscription=round(self.oversubscription, 2),
            tier_tokens_needed=self.tier_tokens_needed, tier_bytes_needed=self.tier_bytes_needed)


def count_tokens(model: str, text: str) -> int:
    """Tokens of `text` with the model's own tokenizer when it is local, else an estimate."""
    tokenizer = Path(model) / "tokenizer.json"
    if tokenizer.is_file():
        from tokenizers import Tokenizer

        return len(Tokenizer.from_file(str(tokenizer)).encode(text).ids)
    return math.ceil(len(text.split()) * workloads.TOKENS_PER_WORD)


def fit_preamble(model: str, prompt_set: str, preamble_tokens: int, max_tokens: int,
                 ctx: int, turns: int = 1) -> int:
    """The largest preamble size (at most the one asked for) whose longest prompt, measured
    with the model's own tokenizer, leaves room for the answer within the context.

    Workload sizes are estimates for a typical English tokenizer; a model whose tokenizer
    splits words finer would otherwise get prompts longer than its context (HTTP 400).
    """
    size = preamble_tokens
    for _ in range(4):
        prompts = workloads.build(prompt_set, turns, preamble_tokens=size, turns=turns)
        longest = max(count_tokens(model, p.as_text()) for p in prompts)
        budget = int(0.9 * ctx) - turns * max_tokens
        if longest <= budget:
            return size
        size = max(16, int(size * budget / longest * 0.95))
    return size


def plan_pressure(model: str, concurrency: int, preamble_tokens: int, max_tokens: int,
                  bytes_per_token: float, *, ctx: int, block_size: int = 16,
                  min_requests: int = 0) -> PressurePlan:
    """Users, requests and a KV cache size that put user sessions under pressure: the users'
    live conversations are at least `OVERSUBSCRIPTION` times the cache.

    The cache also holds at least one full-context sequence: vLLM refuses to start otherwise.
    """
    preamble_tokens = fit_preamble(model, "multi-turn", preamble_tokens, max_tokens, ctx, TURNS)
    # one conversation's turns: each resends the previous turn's prompt, which a cache that
    # never evicted would serve
    turns = [count_tokens(model, p.as_text()) for p in workloads.build(
        "multi-turn", TURNS, preamble_tokens=preamble_tokens, start=0, turns=TURNS)]
    reusable = sum(turns[:-1]) / sum(turns)
    conv = turns[-1] + TURNS * max_tokens
    cache = math.ceil(max(concurrency * conv * HEADROOM, ctx) / block_size) * block_size
    users = max(concurrency, math.ceil(OVERSUBSCRIPTION * cache / conv))
    requests = max(min_requests, users * TURNS)
    conversations = math.ceil(requests / TURNS)
    return PressurePlan(concurrency, requests, conversations, conv, users * conv, cache,
                        math.ceil(cache * bytes_per_token), bytes_per_token,
                        round(reusable, 3), preamble_tokens, users)
