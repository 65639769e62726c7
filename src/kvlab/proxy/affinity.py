"""Affinity routing: which replica a request's key belongs to, with a bound on imbalance.

Two keys, both read from the client's parsed body:

- prefix affinity: the chained hash of the prompt's leading whole blocks (`blocks` blocks of
  `block_tokens` tokens) in the model's own tokens, counted with its `tokenizer.json`
  (Hugging Face `tokenizers`, Rust). Requests that open with the same blocks get the same
  key, so a shared preamble or a conversation's growing history goes where its blocks were
  computed. Only the leading characters are tokenized (`TEXT_PER_TOKEN` characters per token
  wanted, doubled while that gave too few tokens), so the cost does not grow with the prompt,
  and a leading text seen lately is not tokenized again (an LRU of `KEYS_KEPT` texts: a shared
  preamble or a conversation's later turns cost a dictionary lookup). Measured on this 2-core
  machine under the others' load, with the tiny model's byte-level BPE (about 1.6 characters a
  token, ~1.2 us a token): 4 blocks of 16 tokens cost 0.3-0.5 ms on a miss (every request of
  the `mixed` set) and 16 us a request over the `shared-prefix` set (4 preambles), where
  tokenizing a whole 4,096-token prompt costs ~11 ms. A chat request's text is its messages as
  `role: content` lines, not the engine's chat template (which adds the same few tokens per
  message: two requests that share a prefix still share its key). A prompt shorter than one
  block is keyed by all of its tokens.
- conversation affinity: what identifies a conversation, in this order: the OpenAI `user`
  field (the caller's own name for the end user, the one field of the API meant for this),
  else its opening: the system messages and the first user message, which every turn of an
  OpenAI chat resends unchanged. A completion request's key is its prompt's first line.

The key picks a replica by consistent hashing with bounded loads (Mirrokni, Thorup and
Zadimoghaddam, 2018; HAProxy's `hash-balance-factor`): each replica owns `VNODES` points on a
ring, a key walks the ring from its hash, and the first replica whose requests in flight stay
within `load_factor` x the mean (counting this one) takes it. So no replica holds more than
ceil(load_factor x mean), a key's overflow goes to the same next replica every time (which then
caches it too), and adding or losing a replica moves only its own keys. The bound is never
below `MIN_BOUND` in flight: at low load the formula alone (ceil(1.25 x 2 / 3) = 1 with two
requests in flight over three replicas) sends a key away from its cache whenever its replica
is busy at all, where an engine batches a few requests at little cost (vllm-router's
`cache_aware` tolerates a difference of 64 before it balances). Nothing is learned from
traffic: every proxy worker (PROXY_WORKERS) decides alike from the ring, and only the load
bound, counted per worker, can differ between them.

For the facts this is set against: vllm-router's `cache_aware` keeps per worker an approximate
radix tree of the request text it sent there, routes to the longest match above
`--cache-threshold` (0.3), else to the smallest tree, and switches to the shortest queue while
(max - min) in-flight > `--balance-abs-threshold` (64) and max > `--balance-rel-threshold` (1.5)
x min; its `consistent_hash` hashes a session or user id from the headers (else the body) onto a
ring of 160 virtual nodes per worker, with no load bound. SGLang's router is the origin of the
cache-aware tree and the same two thresholds; llm-d's scheduler adds a prefix-cache score to
queue-depth and KV-utilisation scores by weight, bounding imbalance softly through the weights.
"""

from __future__ import annotations

import hashlib
import json
import math
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from kvlab.core import SettingError
from kvlab.core import load_tokenizer as core_tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer

Affinity = Literal["prefix", "conversation"]
VNODES = 64  # ring points per replica: the largest share is within ~25% of 1/n at n = 16
TEXT_PER_TOKEN = 5  # characters read per leading token wanted (English BPE averages ~4)
KEYS_KEPT = 4096  # leading texts whose key is remembered
DEFAULT_BLOCKS = 4
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size on GPU
DEFAULT_LOAD_FACTOR = 1.25
MIN_BOUND = 4  # requests in flight a replica may always hold for its own keys


class Loaded(Protocol):
    """A replica as the router sees it: how many requests it has in flight, and whether
    it may be chosen now."""

    outstanding: int

    def up(self, now: float) -> bool: ...


def digest(data: bytes) -> int:
    """A 64-bit hash that is the same in every process (Python's own hash of str is not)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Ring:
    """`VNODES` points per replica on a 64-bit ring, named by the replica's URL."""

    def __init__(self, names: Sequence[str], vnodes: int = VNODES) -> None:
        points = sorted((digest(f"{name}#{v}".encode()), i)
                        for i, name in enumerate(names) for v in range(vnodes))
        self.hashes = [h for h, _ in points]
        self.owners = [i for _, i in points]
        self.size = len(names)

    def owners_from(self, key: int) -> Iterator[int]:
        """Every replica once, in ring order from `key`'s point, found as it is asked for
        (the first one or two are all a choice within the bound usually reads)."""
        start = bisect_left(self.hashes, key)
        seen: set[int] = set()
        owners, count = self.owners, len(self.owners)
        for k in range(count):
            owner = owners[(start + k) % count]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.size:
                    return

    def walk(self, key: int) -> list[int]:
        """Every replica once, in ring order from `key`'s point."""
        return list(self.owners_from(key))


def load_bound(in_flight: int, replicas: int, load_factor: float) -> int:
    """The requests in flight a replica may hold and still take a key: `in_flight` counts
    this request, over the `replicas` that are up (never below `MIN_BOUND`)."""
    return max(MIN_BOUND, math.ceil(load_factor * in_flight / replicas))


def bounded_choice(ring: Ring, key: int, legs: Sequence[Loaded], load_factor: float,
                   now: float) -> int:
    """The first replica from `key` on the ring that is up and within the load bound; if
    every one that is up is at the bound, the least loaded of them; if none is up, the key's
    own replica (its failure is then counted as any other)."""
    live = [i for i, leg in enumerate(legs) if leg.up(now)]
    if not live:
        return next(ring.owners_from(key))
    bound = load_bound(sum(legs[i].outstanding for i in live) + 1, len(live), load_factor)
    up = set(live)
    order = []
    for i in ring.owners_from(key):  # read only as far as the first within the bound
        if i in up:
            if legs[i].outstanding + 1 <= bound:
                return i
            order.append(i)
    return min(order, key=lambda i: legs[i].outstanding)


# --- keys ------------------------------------------------------------------------------------

def _messages(body: dict[str, object]) -> list[tuple[str, str]]:
    raw = body.get("messages")
    if not isinstance(raw, list):
        return []
    out = []
    for m in raw:
        if isinstance(m, dict):
            out.append((str(m.get("role", "")), _content_text(m.get("content"))))
    return out


def _content_text(content: object) -> str:
    """A message's text: the string, or the text of its content parts (images and other
    parts carry no text to key on); never the repr of a hostile structure."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def prompt_ids(body: dict[str, object]) -> list[int] | None:
    """A completion request's prompt given as token ids (its leading list when several)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt[:64]):
        return [t for t in prompt if isinstance(t, int)]
    return None


def prompt_text(body: dict[str, object], limit: int) -> str:
    """The first `limit` characters of what the request asks about: a completion's prompt,
    or a chat's messages as `role: content` lines."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:limit]
    parts: list[str] = []
    size = 0
    for role, content in _messages(body):
        piece = f"{role}: {content}\n"
        parts.append(piece)
        size += len(piece)
        if size >= limit:
            break
    return "".join(parts)[:limit]


def conversation_key(body: dict[str, object]) -> int:
    """The conversation a request belongs to (see the module's docstring)."""
    user = body.get("user")
    if isinstance(user, str) and user:
        return digest(b"user:" + user.encode())
    messages = _messages(body)
    if messages:
        opening = []
        for role, content in messages:
            opening.append(f"{role}: {content}")
            if role == "user":
                break
        return digest("\n".join(opening).encode())
    prompt = body.get("prompt")
    first = prompt.split("\n", 1)[0] if isinstance(prompt, str) else repr(prompt)
    return digest(first.encode())


def block_key(tokens: Sequence[int], block_tokens: int, blocks: int) -> int:
    """The chained hash of the leading `blocks` whole blocks (all tokens when shorter than
    one block)."""
    whole = min(blocks, len(tokens) // block_tokens)
    if whole == 0:
        return digest(b"short:" + ",".join(map(str, tokens)).encode())
    parent = b"kvlab"
    for b in range(whole):
        chunk = tokens[b * block_tokens:(b + 1) * block_tokens]
        parent = hashlib.blake2b(parent + ",".join(map(str, chunk)).encode(),
                                 digest_size=8).digest()
    return int.from_bytes(parent, "big")


def load_tokenizer(path: str) -> Tokenizer:
    """The model's `tokenizer.json` (the file, or the model directory holding it)."""
    return core_tokenizer(path, "for prefix affinity")


class PrefixKey:
    """The prefix-affinity key of a request body, in the model's own tokens."""

    def __init__(self, tokenizer: Tokenizer, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                 blocks: int = DEFAULT_BLOCKS) -> None:
        if block_tokens < 1 or blocks < 1:
            raise SettingError("prefix affinity needs at least one block of at least one token")
        self.tokenizer = tokenizer
        self.block_tokens = block_tokens
        self.blocks = blocks
        self.wanted = block_tokens * blocks
        self.chars = TEXT_PER_TOKEN * self.wanted
        self.known: OrderedDict[str, int] = OrderedDict()

    def __call__(self, body: dict[str, object]) -> int:
        if (ids := prompt_ids(body)) is not None:  # already the model's tokens
            return block_key(ids[:self.wanted], self.block_tokens, self.blocks)
        chars = self.chars
        while True:
            text = prompt_text(body, chars)
            if (key := self.known.get(text)) is not None:
                self.known.move_to_end(text)
                return key
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) >= self.wanted or len(text) < chars:
                break
            chars *= 2  # long tokens: read further
        key = block_key(ids, self.block_tokens, self.blocks)
        self.known[text] = key
        if len(self.known) > KEYS_KEPT:
            self.known.popitem(last=False)
        return key


def body_digest(body: dict[str, object]) -> str:
    """The request's messages (or prompt) as a short hex digest: a run that knows what it
    sent finds each prompt's line in a pick log by it (`legs.PickLog`)."""
    what = body.get("messages", body.get("prompt"))
    data = json.dumps(what, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(data.encode(), digest_size=12).hexdigest()
