"""The request stream a plan simulates: each request's blocks, arrival, output length and the
two keys kvlab's proxy routes by.

Two sources. A trace (Mooncake's JSONL, read by `loadgen.trace`, the reader `kvlab load
--trace` uses): a request arrives at its timestamp, and its prompt is what `kvlab load
--trace` sends: block `h`'s tokens are the same wherever `h` appears, the tokens past the last
hash id are the request's own. In the cache's block size: the trace's ids as they are when the
sizes agree (as the oracle takes them), else each cache block named by the trace blocks (and
offsets) it covers, chained; a block holding a request's own tokens is its own. User sessions
(`sessions`): conversations of `turns` turns, each prompt the shared system tokens, the
conversation's own opening document, then its questions and replies so far (sizes given in
tokens, not tokenized: the chat template's few tokens a message are not counted); turn t+1
arrives a think time after turn t's last token, and a user takes the next conversation when
one ends, so those arrivals are known only as the simulation runs (`after`, `think_s`).

The keys are the proxy's (`proxy.affinity`): prefix affinity hashes the prompt's leading
`affinity_blocks` x `affinity_block_tokens` tokens (all of them when shorter than one block);
conversation affinity, with no `user` field and token-id prompts (a trace's requests), hashes
the whole prompt, and for chat (sessions) the system and first user message, which are the
conversation's own. Here a key is the digest of what those tokens are made of, so two requests
share one exactly when their tokens would.

Not here: the simulation (`simulate.py`) and the routing (`routing.py`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from kvlab.core import InputError
from kvlab.loadgen import ThinkTime
from kvlab.loadgen import trace as traces
from kvlab.measure import Blocks, oracle
from kvlab.proxy import affinity

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]
OWN = -1  # a piece of a request's own tokens (followed by the request's index)
SYSTEM = -2  # a piece of the sessions' shared system tokens
TRACE_BLOCK_TOKENS = traces.BLOCK_TOKENS  # the published Mooncake traces'
FIXED = -1  # `after`: the request arrives at its own time
QUEUED = -2  # `after`: a closed loop's request, sent as any request ends (in stream order)
ROOT = 0x706C616E  # the parent of a prompt's first block; any fixed int works


class TracedRequest(Protocol):
    """A trace request as `from_trace` reads it (`loadgen.trace.TraceRequest`)."""

    @property
    def timestamp_ms(self) -> float: ...

    @property
    def input_length(self) -> int: ...

    @property
    def output_length(self) -> int: ...

    @property
    def hash_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class Stream:
    """Requests in the order they were made; `arrival_s` is fixed where `after` is FIXED (-1);
    where it is QUEUED (-2) the request waits its turn for the next request of all to end (a
    closed loop's free worker, taking the next prompt); else it arrives `think_s` after
    request `after`'s last token."""

    blocks: tuple[Blocks, ...]
    arrival_s: Floats
    output_tokens: Ints
    conversation_key: tuple[int, ...]
    prefix_key: tuple[int, ...]
    after: Ints
    think_s: Floats
    source: str

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def block_tokens(self) -> int:
        return self.blocks[0].block_tokens if self.blocks else 1

    @property
    def closed(self) -> bool:
        """Whether some arrivals wait on an earlier request's reply."""
        return bool((self.after != FIXED).any())

    def span_s(self) -> float:
        """Seconds from the first fixed arrival to the last."""
        fixed = self.arrival_s[self.after == FIXED]
        return float(fixed.max() - fixed.min()) if len(fixed) else 0.0

    def rate(self) -> float | None:
        """Requests per second over the fixed arrivals' span (None: one instant)."""
        span = self.span_s()
        return len(self) / span if span > 0 else None

    def scaled(self, factor: float) -> Stream:
        """The same requests `factor` times as fast: arrivals and think times divided."""
        if not factor > 0:
            raise InputError(f"a rate scale of {factor}: must be above 0")
        return replace(self, arrival_s=self.arrival_s / factor, think_s=self.think_s / factor)


def _key(parts: object) -> int:
    return affinity.digest(repr(parts).encode())


def _pieces(hash_ids: Sequence[int], covered: int, trace_block: int, lo: int, hi: int,
            index: int) -> tuple[int, ...]:
    """What tokens lo..hi of a trace request are: (id, offset) of each trace block they fall
    in, or the request's own when any lies past the trace blocks."""
    if hi > covered:
        return (OWN, index, lo, hi)
    out: list[int] = []
    for k in range(lo // trace_block, (hi - 1) // trace_block + 1):
        out += (hash_ids[k], max(lo, k * trace_block) - k * trace_block,
                min(hi, (k + 1) * trace_block) - k * trace_block)
    return tuple(out)


def _trace_blocks(hash_ids: Sequence[int], length: int, index: int, trace_block: int,
                  block_tokens: int) -> Blocks:
    if block_tokens == trace_block:  # the ids as they are, as the oracle's `from_trace`
        return Blocks(tuple(hash_ids[:length // block_tokens]), length, block_tokens)
    covered = min(length, len(hash_ids) * trace_block)
    parent, out = ROOT, []
    for j in range(length // block_tokens):
        lo = j * block_tokens
        parent = hash((parent, _pieces(hash_ids, covered, trace_block, lo, lo + block_tokens,
                                       index)))
        out.append(parent)
    return Blocks(tuple(out), length, block_tokens)


@dataclass(frozen=True)
class Keys:
    """How the proxy keys prefix affinity: leading blocks of its block size."""

    blocks: int = affinity.DEFAULT_BLOCKS
    block_tokens: int = affinity.DEFAULT_BLOCK_TOKENS

    def leading(self, length: int) -> int:
        """The leading tokens a prompt of `length` is keyed by."""
        whole = min(self.blocks, length // self.block_tokens)
        return whole * self.block_tokens if whole else length


def from_trace(requests: Sequence[TracedRequest], block_tokens: int, *,
               trace_block: int, keys: Keys = Keys(), source: str = "trace") -> Stream:
    """A trace's requests (in arrival order) in the cache's blocks of `block_tokens`."""
    blocks, prefix, conversation = [], [], []
    for i, r in enumerate(requests):
        ids, length = r.hash_ids, r.input_length
        covered = min(length, len(ids) * trace_block)
        blocks.append(_trace_blocks(ids, length, i, trace_block, block_tokens))
        lead = keys.leading(length)
        prefix.append(_key(_pieces(ids, covered, trace_block, 0, lead, i)))
        conversation.append(_key(_pieces(ids, covered, trace_block, 0, length, i)))
    n = len(blocks)
    first = requests[0].timestamp_ms if n else 0.0
    return Stream(tuple(blocks),
                  np.array([(r.timestamp_ms - first) / 1000 for r in requests], dtype=np.float64),
                  np.array([r.output_length for r in requests], dtype=np.int64),
                  tuple(conversation), tuple(prefix), np.full(n, -1, dtype=np.int64),
                  np.zeros(n, dtype=np.float64), source)


def repeated(requests: Sequence[TracedRequest], copies: int) -> list[TracedRequest]:
    """The trace `copies` times over, a longer trace at the same rate: copy c's timestamps
    shifted by c x (the span + one mean gap between arrivals), its hash ids by c x (the
    largest id + 1), so that no block of one copy is any other copy's. Copies share nothing
    because the trace does not say which of its ids are text every user sends (a system
    prompt) and which are one conversation's; so a copy is new users, and the longer trace's
    hits are at most what sharing would give."""
    if copies < 1:
        raise InputError(f"--trace-repeat {copies}: give 1 or more copies of the trace")
    if copies == 1 or not requests:
        return list(requests)
    times = [r.timestamp_ms for r in requests]
    span = max(times) - min(times)
    shift = span + span / (len(requests) - 1) if len(requests) > 1 else 0.0
    step = max((max(r.hash_ids, default=-1) for r in requests), default=-1) + 1
    return [traces.TraceRequest(r.timestamp_ms + c * shift, r.input_length, r.output_length,
                                tuple(h + c * step for h in r.hash_ids))
            for c in range(copies) for r in requests]


FIXED_1S = ThinkTime("fixed", 1.0)


@dataclass(frozen=True)
class Sessions:
    """User sessions as kvlab's `--sessions` runs them, sized in tokens."""

    users: int
    turns: int = 4
    conversations: int | None = None  # None: one per user
    think: ThinkTime = FIXED_1S
    user_rate: float | None = None  # None: every user there from the start
    system_tokens: int = 12
    document_tokens: int = 1024
    question_tokens: int = 32
    reply_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.users < 1 or self.turns < 1 or (self.conversations or 1) < 1:
            raise InputError("--sessions, --turns and --conversations: give at least 1")
        if min(self.system_tokens, self.document_tokens, self.question_tokens,
               self.reply_tokens) < 0:
            raise InputError("session token sizes: give 0 or more")
        if self.think.kind == "paced":
            raise InputError("--think-time paced:N needs a measured request time: give "
                             "fixed:S or exponential:S")

    def describe(self) -> str:
        return (f"sessions: {self.users} users, {self.conversations or self.users} "
                f"conversations of {self.turns} turns, think {self.think.kind} "
                f"{self.think.mean_s:g} s, system {self.system_tokens} + document "
                f"{self.document_tokens} tokens, {self.question_tokens} a question, "
                f"{self.reply_tokens} a reply, seed {self.seed}")


def _session_blocks(system: int, conv: int, length: int, block_tokens: int) -> Blocks:
    """A conversation's prompt of `length` tokens: whole blocks of shared system tokens, then
    the conversation's own (a conversation only grows, so its blocks never change)."""
    parent, out = ROOT, []
    for j in range(length // block_tokens):
        end = (j + 1) * block_tokens
        parent = hash((parent, (SYSTEM, j) if end <= system else (conv, j)))
        out.append(parent)
    return Blocks(tuple(out), length, block_tokens)


def sessions(spec: Sessions, block_tokens: int, keys: Keys = Keys()) -> Stream:
    """Every turn of every conversation, in the order they were made. With a user rate each
    conversation is a user arriving (seeded Poisson, the first at 0); else the users are all
    there, their first turns spread over one mean think time, and user u's next conversation
    starts as its last one ends (kvlab gives it to whichever user is free first: here to
    the same user, which differs only when conversations outnumber users)."""
    rng = random.Random(f"plan-sessions:{spec.seed}")
    count = spec.conversations or spec.users
    blocks: list[Blocks] = []
    arrival, after, think, output, prefix, conversation = [], [], [], [], [], []
    last_turn: list[int] = []  # per conversation, its last turn's index
    at = 0.0
    for conv in range(count):
        first_at, waits = 0.0, -1
        if spec.user_rate:
            first_at = at
            at += rng.expovariate(spec.user_rate)
        elif conv < spec.users:
            first_at = rng.uniform(0, spec.think.mean_s)
        else:
            waits = last_turn[conv - spec.users]
        opening = spec.system_tokens + spec.document_tokens + spec.question_tokens
        for turn in range(spec.turns):
            length = opening + turn * (spec.reply_tokens + spec.question_tokens)
            blocks.append(_session_blocks(spec.system_tokens, conv, length, block_tokens))
            arrival.append(first_at if turn == 0 else 0.0)
            after.append(waits if turn == 0 else len(blocks) - 2)
            think.append(spec.think.sample(rng) if turn else 0.0)
            output.append(spec.reply_tokens)
            conversation.append(_key(("conversation", conv)))
            lead = keys.leading(length)
            prefix.append(_key(("system", lead)) if lead <= spec.system_tokens
                          else _key(("conversation", conv)))
        last_turn.append(len(blocks) - 1)
    return Stream(tuple(blocks), np.array(arrival, dtype=np.float64),
                  np.array(output, dtype=np.int64), tuple(conversation), tuple(prefix),
                  np.array(after, dtype=np.int64), np.array(think, dtype=np.float64),
                  spec.describe())


class Body(Protocol):
    """A request the proxy keys: its chat messages (`loadgen.Prompt`)."""

    @property
    def index(self) -> int: ...

    def as_messages(self) -> list[dict[str, str]]: ...


def closed_loop(prompts: Sequence[Body], tokens: Mapping[int, Sequence[int]],
                block_tokens: int, concurrency: int, output_tokens: int,
                prefix_key: Callable[[dict[str, object]], int] | None, source: str) -> Stream:
    """Chat prompts sent in this order by a closed loop of `concurrency` (the first c at
    once, each later one as soon as any request ends), each as its exact tokens (`tokens`,
    by prompt index: the engine's /tokenize, chat template applied) and keyed as kvlab's
    proxy keys its body: `prefix_key` (the proxy's `affinity.PrefixKey`; None: the
    conversation key stands in, for a policy that reads none) and
    `affinity.conversation_key`."""
    missing = [p.index for p in prompts if p.index not in tokens]
    if missing:
        raise InputError(f"prompt {missing[0]} could not be tokenized by the replica")
    blocks = tuple(oracle.prepare([tokens[p.index] for p in prompts], block_tokens))
    bodies: list[dict[str, object]] = [{"messages": p.as_messages()} for p in prompts]
    conversation = tuple(affinity.conversation_key(b) for b in bodies)
    prefix = tuple(prefix_key(b) for b in bodies) if prefix_key is not None else conversation
    n = len(prompts)
    after = np.full(n, QUEUED, dtype=np.int64)
    after[:concurrency] = FIXED
    return Stream(blocks, np.zeros(n, dtype=np.float64),
                  np.full(n, output_tokens, dtype=np.int64), conversation, prefix, after,
                  np.zeros(n, dtype=np.float64), source)


def trace_stream(path: str, block_tokens: int, keys: Keys, *, trace_block: int,
                 limit: int | None = None, max_input: int | None = None,
                 over: Literal["truncate", "filter"] = "truncate", repeat: int = 1) -> Stream:
    """A trace file read as `kvlab load --trace` reads it, in the cache's blocks (`repeat`
    copies of it, `repeated`)."""
    spec = traces.TraceSpec(path, trace_block, limit=limit, max_input=max_input, over=over)
    read = traces.read(spec)
    copies = f", {repeat} copies sharing no block" if repeat > 1 else ""
    return from_trace(repeated(read.requests, repeat), block_tokens, trace_block=trace_block,
                      keys=keys, source=f"trace {path} (sha256 {read.sha256[:16]}, "
                      f"{len(read.requests)} requests{copies})")


def session_stream(users: int, block_tokens: int, keys: Keys, *, think: str, turns: int,
                   conversations: int | None, user_rate: float | None, system_tokens: int,
                   document_tokens: int, question_tokens: int, reply_tokens: int,
                   seed: int) -> Stream:
    """User sessions from `kvlab plan`'s options (`think`: as `--think-time` takes it)."""
    spec = Sessions(users, turns, conversations, ThinkTime.parse(think), user_rate,
                    system_tokens, document_tokens, question_tokens, reply_tokens, seed)
    return sessions(spec, block_tokens, keys)
