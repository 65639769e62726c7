"""Finding the pressure point: a KV cache too small for the workload's working set.

A host-memory tier does nothing until blocks are evicted and wanted again. The workload that
wants them again is users who come back: user sessions (`loadgen.sessions`), each user's next
turn sent after its reply and a think time, during which the other users' turns push its
blocks out. This module sizes the device cache to hold the concurrent requests comfortably,
and the user population so that their live conversations (the working set) are several times
the cache: a returning turn then finds its blocks evicted (recomputed without a tier, recalled
with one). It also says how large a host tier must be so that no returning conversation is
lost: the whole working set, since vLLM's host tier keeps a copy of every block it stores
whether or not the device still holds it; a tier smaller than that is known as such.

Every size is in the model's own tokens, counted before any engine starts with its directory's
tokenizer and chat template (`loadgen.tokens`), and the load is built with the plan's sizing,
so the planned working set is the one sent; a model that is not a local directory is sized
with the word estimate and its plan says so. The run records the pressure reached beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ConfigDict

from kvlab.loadgen import ChatTokens, workloads
from kvlab.records import LoadRecord, PressurePlanned, Record

TURNS = workloads.DEFAULT_TURNS
HEADROOM = 1.5  # the cache holds this many times the concurrent requests' tokens
OVERSUBSCRIPTION = 3.0  # the working set is at least this many times the cache


class PressurePlan(PressurePlanned):
    """The pressure a run is sized for: the figures its line states (`PressurePlanned`), every
    one known here, with the sizing the load builds its prompts with."""

    model_config = ConfigDict(frozen=True)

    preamble_tokens: int  # the workload's size, fitted to the context
    users: int = 0  # live at once, one conversation each: the working set's conversations
    turns: int = TURNS
    first_turn_tokens: int = 0  # conversation 0's first prompt, chat template included
    # what a host tier must hold so that no evicted conversation is lost: the working set
    # (the tier is inclusive: it copies what it stores, the device keeps its own)
    tier_tokens_needed: int = 0
    tier_bytes_needed: int = 0
    sizing: workloads.Sizing = workloads.ESTIMATE  # the load's: the plan's tokens are its

    def tier_gb(self, asked_gb: float) -> float:
        """The host tier to start: what was asked, raised to hold the working set (whole
        GiB)."""
        return max(asked_gb, float(math.ceil(self.tier_bytes_needed / 2**30)))

    def tier_note(self, gb: float) -> str:
        """Said when a tier cannot hold the working set ("" when it can)."""
        need = self.tier_bytes_needed / 2**30
        if gb * 2**30 >= self.tier_bytes_needed:
            return ""
        return (f"a {gb:g} GiB host tier cannot hold the working set ({need:.1f} GiB): this run "
                "measures a tier smaller than it (its own report row; the oracle's tier curve says "
                f"what larger sizes would have recalled); --tier-gb working-set starts "
                f"{self.tier_gb(0.0):g} GiB")

    def as_record(self) -> PressurePlanned:
        """The plan as its line states it (the working set against the cache to 2 places)."""
        return PressurePlanned.model_validate({
            **self.model_dump(exclude={"sizing"}), "tokens_from": self.tokens_from or None,
            "oversubscription": round(self.oversubscription, 2)})


ESTIMATED = "the word estimate (TOKENS_PER_WORD): MODEL is no local directory with a " \
    "tokenizer.json"


@dataclass(frozen=True)
class Counter:
    """How a plan counts a chat prompt's tokens before any engine runs: the model directory's
    tokenizer and chat template (`loadgen.tokens`), else the word estimate, said as such."""

    chat: ChatTokens | None

    @classmethod
    def of(cls, model: str) -> Counter:
        return cls(ChatTokens.of(model))

    @property
    def source(self) -> str:
        return self.chat.source if self.chat is not None else ESTIMATED

    def prompt(self, p: workloads.Prompt) -> int:
        if self.chat is not None:
            return self.chat.chat(p.as_messages())
        return math.ceil(len(p.as_text().split()) * workloads.TOKENS_PER_WORD)

    def sizing(self, seed: int, preamble_tokens: int) -> workloads.Sizing:
        """The sizing the run's prompts are built with: in the model's own tokens when its
        tokenizer is here, else the estimate."""
        if self.chat is None:
            return workloads.ESTIMATE
        return self.chat.sizing(seed, preamble_tokens)


def fit_preamble(model: str, prompt_set: str, preamble_tokens: int, max_tokens: int,
                 ctx: int, turns: int = 1, sizing: workloads.Sizing = workloads.ESTIMATE,
                 ) -> int:
    """The largest preamble size (at most the one asked for) whose longest prompt, counted
    as the server will (the model's tokenizer and chat template), leaves room for the answer
    within the context. `sizing` is the one the run's prompts are built with."""
    counter = Counter.of(model)
    size = preamble_tokens
    for _ in range(4):
        prompts = workloads.build(prompt_set, turns, preamble_tokens=size, turns=turns,
                                  sizing=sizing)
        longest = max(counter.prompt(p) for p in prompts)
        budget = int(0.9 * ctx) - turns * max_tokens
        if longest <= budget:
            return size
        size = max(16, int(size * budget / longest * 0.95))
    return size


def session_turns(counter: Counter, sizing: workloads.Sizing, preamble_tokens: int,
                  conversation: int = 0) -> list[int]:
    """Each turn's prompt tokens of one user session, the replies left empty (a reply's
    tokens are the answer's, counted apart): turn 0 exactly as the load will send it."""
    history: tuple[tuple[str, str], ...] = ()
    out = []
    for turn in range(TURNS):
        prompt = workloads.session_turn(0, seed=0, conversation=conversation, turn=turn,
                                        history=history, tokens=preamble_tokens, sizing=sizing)
        out.append(counter.prompt(prompt))
        history = (*history, prompt.messages[-1], ("assistant", ""))
    return out


def fit_opening(counter: Counter, sizing: workloads.Sizing, preamble_tokens: int,
                max_tokens: int, ctx: int) -> tuple[int, list[int]]:
    """The largest opening (at most the one asked for) whose whole conversation, answers
    included, fits 90% of the context; with its turns' prompt tokens."""
    size = preamble_tokens
    for _ in range(6):
        turns = session_turns(counter, sizing, size)
        need = turns[-1] + TURNS * max_tokens
        if need <= int(0.9 * ctx) or size <= 16:
            return size, turns
        size = max(16, int(size - (need - int(0.9 * ctx)) * 1.05))
    return size, session_turns(counter, sizing, size)


def plan_pressure(model: str, concurrency: int, preamble_tokens: int, max_tokens: int,
                  bytes_per_token: float, *, ctx: int, block_size: int = 16,
                  min_requests: int = 0, cache_tokens: int = 0) -> PressurePlan:
    """Users, requests and a KV cache size that put user sessions under pressure: the users'
    live conversations are at least `OVERSUBSCRIPTION` times the cache.

    Token counts are the model's own (its directory's tokenizer and chat template) when it
    is local, so the planned working set is the one the load sends: the opening is sized in
    those tokens and the plan's `sizing` is the load's. The cache also holds at least one
    full-context sequence and vLLM's null block: vLLM refuses to start otherwise.
    `cache_tokens` fixes the cache (a sweep of opening lengths against one engine): the users
    then fill it as before.
    """
    counter = Counter.of(model)
    sizing = counter.sizing(0, preamble_tokens)
    preamble_tokens, turns = fit_opening(counter, sizing, preamble_tokens, max_tokens, ctx)
    # each turn resends the previous turn's prompt and its answer, which a cache that never
    # evicted would serve
    prompts = [t + i * max_tokens for i, t in enumerate(turns)]
    reusable = sum(prompts[:-1]) / sum(prompts)
    conv = turns[-1] + TURNS * max_tokens
    # vLLM keeps one block of the cache as its null block: a cache of exactly CTX tokens is
    # refused ("the estimated maximum model length is" one block less)
    floor = ctx + block_size
    cache = cache_tokens or \
        math.ceil(max(concurrency * conv * HEADROOM, floor) / block_size) * block_size
    users = max(concurrency, math.ceil(OVERSUBSCRIPTION * cache / conv))
    requests = max(min_requests, users * TURNS)
    conversations = math.ceil(requests / TURNS)
    working_set = users * conv
    return PressurePlan(
        concurrency=concurrency, requests=requests, conversations=conversations,
        conversation_tokens=conv, working_set_tokens=working_set, cache_tokens=cache,
        kv_cache_bytes=math.ceil(cache * bytes_per_token), bytes_per_token=bytes_per_token,
        reusable_fraction=round(reusable, 3), preamble_tokens=preamble_tokens, users=users,
        first_turn_tokens=turns[0], sizing=sizing, tokens_from=counter.source,
        oversubscription=working_set / cache, tier_tokens_needed=working_set,
        tier_bytes_needed=math.ceil(working_set * bytes_per_token))


def think_of(rows: Sequence[Record]) -> float | None:
    """The mean think time a pressure run's sessions used (a paced one, as resolved)."""
    for row in rows:
        if isinstance(row, LoadRecord) and row.workload and row.workload.think_time:
            return row.workload.think_time.mean_s
    return None
