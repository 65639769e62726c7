"""Deterministic prompt sets for the load generator: shared-prefix, mixed, multi-turn.

- `shared-prefix`: one long preamble (about `preamble_tokens` tokens, 4,096 by default) as the
  system message, then a short question that differs per request. The workload a prefix cache
  and a prefill/decode split are aimed at.
- `mixed`: the control. Each request carries its own document (a quarter to the whole of the
  preamble's length) under a short common system line, so little beyond the chat template is
  shared between requests.
- `multi-turn`: conversations that grow. Each has its own opening document; turn t resends the
  whole history plus a new question. Requests are ordered turn by turn across conversations,
  so turn t of a conversation always comes after its turn t-1.

Everything is a pure function of (set, index, seed, preamble size): the same arguments give the
same text on every machine. Sizes are in tokens of a typical English BPE tokenizer (about 1.3
per word); the server's `usage.prompt_tokens` in each record is the truth for the model used.
This module knows nothing about HTTP or engines.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from kvlab.core.errors import InputError

PROMPT_SETS = ("shared-prefix", "mixed", "multi-turn")
DEFAULT_PREAMBLE_TOKENS = 4096
DEFAULT_TURNS = 4
TOKENS_PER_WORD = 1.3
SYSTEM_LINE = "You are a careful assistant. Answer in plain sentences."

_WORDS = (
    "river", "light", "valley", "bridge", "wind", "morning", "market", "bread", "copper", "map",
    "letter", "town", "harbour", "lantern", "garden", "stone", "window", "winter", "summer",
    "road", "field", "orchard", "mill", "clock", "tower", "signal", "engine", "ledger", "merchant",
    "ship", "cargo", "weather", "storm", "tide", "island", "forest", "path", "hill", "village",
    "school", "library", "teacher", "student", "record", "archive", "paper", "ink", "table",
    "chair", "kitchen", "salt", "grain", "barley", "wheat", "honey", "candle", "glass", "mirror",
    "door", "key", "lock", "shelf", "basket", "rope", "anchor", "sail", "compass", "star", "moon",
    "cloud", "rain", "snow", "frost", "spring", "autumn", "harvest", "festival", "song", "drum",
    "violin", "painter", "canvas", "colour", "blue", "green", "amber", "silver", "iron", "wooden",
    "narrow", "wide", "quiet", "busy", "early", "late", "careful", "patient", "gentle", "bright",
    "distant", "nearby", "ancient", "modern", "simple", "formal", "carries", "holds", "opens",
    "closes", "keeps", "follows", "crosses", "measures", "counts", "writes", "reads", "builds",
    "repairs", "watches", "gathers", "sends", "returns", "waits", "remembers", "explains",
    "records", "compares",
)
_TOPICS = ("the bridge", "the harbour", "the archive", "the market", "the mill", "the storm",
           "the orchard", "the library", "the tower clock", "the cargo", "the festival")


@dataclass(frozen=True)
class Prompt:
    """One request's conversation: (role, content) pairs, in order."""

    index: int
    messages: tuple[tuple[str, str], ...]

    def as_messages(self) -> list[dict[str, str]]:
        """The OpenAI chat `messages` list."""
        return [{"role": role, "content": content} for role, content in self.messages]

    def as_text(self) -> str:
        """A flat prompt for /v1/completions (same content, roles as plain labels)."""
        return "\n\n".join(f"{role}: {content}" for role, content in self.messages) + \
            "\n\nassistant:"


def words_for(tokens: int) -> int:
    """Words of generated text for about `tokens` tokens."""
    return max(1, math.ceil(tokens / TOKENS_PER_WORD))


def passage(rng: random.Random, words: int) -> str:
    """Sentences of 8-16 words drawn from a fixed word list, `words` words in all."""
    sentences, left = [], words
    while left > 0:
        n = min(left, rng.randint(8, 16))
        chosen = [rng.choice(_WORDS) for _ in range(n)]
        sentences.append(" ".join(chosen).capitalize() + ".")
        left -= n
    return " ".join(sentences)


def preamble(seed: int, tokens: int) -> str:
    """The shared preamble of the shared-prefix set (the same for every request)."""
    return passage(random.Random(f"preamble:{seed}"), words_for(tokens))


def question(seed: int, index: int) -> str:
    """A short question, distinct for every request index."""
    rng = random.Random(f"question:{seed}:{index}")
    a, b = rng.sample(_TOPICS, 2)
    return (f"Question {index + 1}: in two sentences, what does the text say about {a} "
            f"and {b}, and which {rng.choice(_WORDS)} matters most?")


def _shared_prefix(index: int, seed: int, tokens: int) -> Prompt:
    return Prompt(index, (("system", preamble(seed, tokens)), ("user", question(seed, index))))


def _mixed(index: int, seed: int, tokens: int) -> Prompt:
    rng = random.Random(f"mixed:{seed}:{index}")
    size = rng.randint(max(1, tokens // 4), max(1, tokens))
    document = passage(rng, words_for(size))
    return Prompt(index, (("system", SYSTEM_LINE),
                          ("user", f"{document}\n\n{question(seed, index)}")))


def _multi_turn(index: int, seed: int, tokens: int, conversations: int) -> Prompt:
    conv, turn = index % conversations, index // conversations
    opening = passage(random.Random(f"conversation:{seed}:{conv}"), words_for(tokens))
    messages: list[tuple[str, str]] = [("system", SYSTEM_LINE)]
    for t in range(turn + 1):
        q = question(seed, conv * 1000 + t)
        messages.append(("user", f"{opening}\n\n{q}" if t == 0 else q))
        if t < turn:
            reply = passage(random.Random(f"reply:{seed}:{conv}:{t}"), 24)
            messages.append(("assistant", reply))
    return Prompt(index, tuple(messages))


def build(prompt_set: str, count: int, *, seed: int = 0,
          preamble_tokens: int = DEFAULT_PREAMBLE_TOKENS, start: int = 0,
          turns: int = DEFAULT_TURNS) -> list[Prompt]:
    """`count` prompts of a set, for request indices start .. start+count-1."""
    if prompt_set not in PROMPT_SETS:
        raise InputError(f"--prompt-set {prompt_set!r}: choose one of {', '.join(PROMPT_SETS)}")
    if preamble_tokens < 1 or count < 0 or turns < 1:
        raise InputError("prompt sizes and counts must be positive")
    if prompt_set == "shared-prefix":
        return [_shared_prefix(i, seed, preamble_tokens) for i in range(start, start + count)]
    if prompt_set == "mixed":
        return [_mixed(i, seed, preamble_tokens) for i in range(start, start + count)]
    conversations = max(1, math.ceil((start + count) / turns))
    return [_multi_turn(i, seed, preamble_tokens, conversations)
            for i in range(start, start + count)]


def describe(prompt_set: str, seed: int, preamble_tokens: int) -> dict[str, Any]:
    """What a notebook row says about the workload it measured."""
    return {"prompt_set": prompt_set, "workload_seed": seed, "preamble_tokens": preamble_tokens}
