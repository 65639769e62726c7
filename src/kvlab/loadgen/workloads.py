"""Deterministic prompt sets for the load generator: shared-prefix, mixed, multi-turn, and
the turns of user sessions.

- `shared-prefix`: one long preamble (`preamble_tokens` tokens, 4,096 by default) as the
  system message, then a short question that differs per request. The workload a prefix cache
  and a prefill/decode split are aimed at. With `groups` G > 1 there are G preambles (the
  same size, different text) and each request picks one, seeded by its index, with the
  `shares` given (equal by default): cache contention between groups, not one hot preamble.
- `mixed`: the control. Each request carries its own document (a quarter to the whole of the
  preamble's length) under a short common system line, so little beyond the chat template is
  shared between requests.
- `multi-turn`: conversations that grow. Each has its own opening document; turn t resends the
  whole history plus a new question. Requests are ordered turn by turn across conversations,
  so turn t of a conversation always comes after its turn t-1. A range of request indices
  starting at `start` holds its own conversations (numbered from `start`), so two disjoint
  ranges (two levels, a warm-up and its level) never share a conversation.

- `session_turn`: one turn of a user session (`loadgen.sessions`): a conversation's opening
  and questions as in `multi-turn`, but the assistant turns are the server's real replies,
  passed in, so the text of a later turn is known only once the earlier reply arrived.

Everything else is a pure function of (set, index range, seed, preamble size, sizing): the same
arguments give the same text on every machine. Sizes are in the served model's tokens when the
`Sizing` was measured with its tokenizer (`calibrate`, driven by `size_with`, or by the load
generator through the engine's /tokenize): the shared preamble is then sized to the token, and
other documents by the tokens per word measured on a long sample. Without a tokenizer the sizing
is the estimate of a typical English BPE tokenizer (`TOKENS_PER_WORD`, about 1.3 per word); the
server's `usage.prompt_tokens` in each record is the truth either way.
This module knows nothing about HTTP or engines.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Literal

from kvlab.core import InputError
from kvlab.records import PrefixGroups, PromptSizing

PROMPT_SETS = ("shared-prefix", "mixed", "multi-turn")
DEFAULT_PREAMBLE_TOKENS = 4096
DEFAULT_TURNS = 4
TOKENS_PER_WORD = 1.3
SYSTEM_LINE = "You are a careful assistant. Answer in plain sentences."
CALIBRATION_WORDS = 2000  # a sample this long puts tokens per word within about 1%
SIZING_STEPS = 8  # counts spent fitting the preamble to the token

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
    conversation: int | None = None  # multi-turn and sessions only
    turn: int | None = None  # multi-turn and sessions only, 0-based
    document_tokens: int | None = None  # the size asked of its preamble, document or opening
    group: int | None = None  # shared-prefix with groups: which preamble
    max_tokens: int | None = None  # its own answer length (a trace's output_length)

    def as_messages(self) -> list[dict[str, str]]:
        """The OpenAI chat `messages` list."""
        return [{"role": role, "content": content} for role, content in self.messages]

    def as_text(self) -> str:
        """A flat prompt for /v1/completions (same content, roles as plain labels)."""
        return "\n\n".join(f"{role}: {content}" for role, content in self.messages) + \
            "\n\nassistant:"


@dataclass(frozen=True)
class Sizing:
    """How many words of generated text make a number of the model's tokens."""

    tokens_per_word: float = TOKENS_PER_WORD
    method: Literal["tokenizer", "estimate"] = "estimate"
    source: str = "TOKENS_PER_WORD"  # the /tokenize URL or tokenizer that counted, or why not
    # the shared preamble fitted to the token: (seed, tokens asked, words, tokens counted)
    exact: tuple[tuple[int, int, int, int], ...] = ()

    def words(self, tokens: int) -> int:
        """Words for about `tokens` tokens."""
        return max(1, math.ceil(tokens / self.tokens_per_word))

    def _fitted(self, seed: int, tokens: int) -> tuple[int, int] | None:
        return next(((w, n) for s, t, w, n in self.exact if (s, t) == (seed, tokens)), None)

    def preamble_words(self, seed: int, tokens: int) -> int:
        fitted = self._fitted(seed, tokens)
        return fitted[0] if fitted else self.words(tokens)

    def as_record(self, seed: int, preamble_tokens: int) -> PromptSizing:
        """What a row says about how its prompts were sized."""
        fitted = self._fitted(seed, preamble_tokens)
        return PromptSizing(method=self.method, source=self.source,
                            tokens_per_word=round(self.tokens_per_word, 4),
                            preamble_tokens_requested=preamble_tokens,
                            preamble_tokens_actual=fitted[1] if fitted else None)


ESTIMATE = Sizing()


def words_for(tokens: int) -> int:
    """Words of generated text for about `tokens` tokens of a typical English tokenizer."""
    return ESTIMATE.words(tokens)


def passage(rng: random.Random, words: int) -> str:
    """Sentences of 8-16 words drawn from a fixed word list, `words` words in all."""
    sentences, left = [], words
    while left > 0:
        n = min(left, rng.randint(8, 16))
        chosen = [rng.choice(_WORDS) for _ in range(n)]
        sentences.append(" ".join(chosen).capitalize() + ".")
        left -= n
    return " ".join(sentences)


@functools.lru_cache(maxsize=256)
def _passage_of(key: str, words: int) -> str:
    # a level reuses one preamble (or opening) hundreds of times: generate it once
    return passage(random.Random(key), words)


def preamble(seed: int, tokens: int, sizing: Sizing = ESTIMATE) -> str:
    """The shared preamble of the shared-prefix set (the same for every request)."""
    return _passage_of(f"preamble:{seed}", sizing.preamble_words(seed, tokens))


def question(seed: int, index: int) -> str:
    """A short question, distinct for every request index."""
    rng = random.Random(f"question:{seed}:{index}")
    a, b = rng.sample(_TOPICS, 2)
    return (f"Question {index + 1}: in two sentences, what does the text say about {a} "
            f"and {b}, and which {rng.choice(_WORDS)} matters most?")


def group_preamble(seed: int, tokens: int, group: int, sizing: Sizing = ESTIMATE) -> str:
    """Group `group`'s preamble: group 0's is `preamble` (fitted to the token); the others
    are other text of the same number of words."""
    if group == 0:
        return preamble(seed, tokens, sizing)
    return _passage_of(f"preamble:{seed}:group{group}", sizing.preamble_words(seed, tokens))


def check_shares(groups: int, shares: tuple[float, ...]) -> tuple[float, ...]:
    """The groups' shares of requests, normalised (equal when none are given)."""
    if groups < 1:
        raise InputError(f"--prefix-groups {groups}: give at least 1")
    if not shares:
        return tuple(1 / groups for _ in range(groups))
    if len(shares) != groups or min(shares) <= 0:
        raise InputError(f"--group-shares {','.join(f'{s:g}' for s in shares)}: give "
                         f"{groups} positive shares, one per prefix group")
    total = sum(shares)
    return tuple(s / total for s in shares)


def group_of(seed: int, index: int, shares: tuple[float, ...]) -> int:
    """Which group request `index` asks about: a seeded draw with the groups' shares."""
    if len(shares) <= 1:
        return 0
    return random.Random(f"group:{seed}:{index}").choices(range(len(shares)), shares)[0]


def _shared_prefix(index: int, seed: int, tokens: int, sizing: Sizing,
                   shares: tuple[float, ...] = ()) -> Prompt:
    group = group_of(seed, index, shares)
    return Prompt(index, (("system", group_preamble(seed, tokens, group, sizing)),
                          ("user", question(seed, index))), document_tokens=tokens,
                  group=group if len(shares) > 1 else None)


def _mixed(index: int, seed: int, tokens: int, sizing: Sizing) -> Prompt:
    rng = random.Random(f"mixed:{seed}:{index}")
    size = rng.randint(max(1, tokens // 4), max(1, tokens))
    document = passage(rng, sizing.words(size))
    return Prompt(index, (("system", SYSTEM_LINE),
                          ("user", f"{document}\n\n{question(seed, index)}")),
                  document_tokens=size)


def _user_message(seed: int, conversation: int, turn: int, tokens: int, sizing: Sizing) -> str:
    q = question(seed, conversation * 1000 + turn)
    if turn:
        return q
    opening = _passage_of(f"conversation:{seed}:{conversation}", sizing.words(tokens))
    return f"{opening}\n\n{q}"


def _multi_turn(index: int, seed: int, tokens: int, sizing: Sizing, start: int,
                conversations: int, turns: int) -> Prompt:
    # rounds of `conversations` conversations, each round turn by turn; a round's
    # conversations are new ones, numbered on from the previous round's
    position = index - start
    done, within = divmod(position, conversations * turns)
    conv = start + done * conversations + within % conversations
    turn = within // conversations
    messages: list[tuple[str, str]] = [("system", SYSTEM_LINE)]
    for t in range(turn + 1):
        messages.append(("user", _user_message(seed, conv, t, tokens, sizing)))
        if t < turn:
            reply = passage(random.Random(f"reply:{seed}:{conv}:{t}"), 24)
            messages.append(("assistant", reply))
    return Prompt(index, tuple(messages), conversation=conv, turn=turn, document_tokens=tokens)


def session_turn(index: int, *, seed: int, conversation: int, turn: int,
                 history: tuple[tuple[str, str], ...], tokens: int,
                 sizing: Sizing = ESTIMATE, distinct_opening: bool = False) -> Prompt:
    """Turn `turn` of a user session: the system line, the conversation so far (`history`:
    its user turns and the server's real replies), then this turn's question (turn 0: the
    conversation's own opening document of `tokens` tokens, then a question).

    `distinct_opening`: the system line begins with a tag of the conversation's own, so no
    two conversations share a cache block (the shared-first-block control)."""
    if turn < 0 or len(history) != 2 * turn:
        raise ValueError(f"turn {turn} needs {2 * turn} messages of history, not "
                         f"{len(history)}")
    message = ("user", _user_message(seed, conversation, turn, tokens, sizing))
    system = f"{opening_tag(seed, conversation)} {SYSTEM_LINE}" if distinct_opening \
        else SYSTEM_LINE
    return Prompt(index, (("system", system), *history, message),
                  conversation=conversation, turn=turn, document_tokens=tokens)


def opening_tag(seed: int, conversation: int) -> str:
    """A conversation's own first words: eight letters drawn from its seed and number."""
    rng = random.Random(f"opening:{seed}:{conversation}")
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) + "."


def build(prompt_set: str, count: int, *, seed: int = 0,
          preamble_tokens: int = DEFAULT_PREAMBLE_TOKENS, start: int = 0,
          turns: int = DEFAULT_TURNS, sizing: Sizing = ESTIMATE,
          conversations: int | None = None, offset: int = 0,
          shares: tuple[float, ...] = ()) -> list[Prompt]:
    """`count` prompts of a set, for request indices start+offset .. start+offset+count-1 of
    the range that begins at `start`.

    multi-turn: `conversations` per round (default: enough for `count` in one round); a
    count beyond one round starts new conversations, so a run cut short by time has still
    sent whole early turns of the conversations it began. shared-prefix: `shares` (from
    `check_shares`) spreads the requests over that many prefix groups.
    """
    if prompt_set not in PROMPT_SETS:
        raise InputError(f"--prompt-set {prompt_set!r}: choose one of {', '.join(PROMPT_SETS)}")
    if (preamble_tokens < 1 or count < 0 or turns < 1 or start < 0 or offset < 0
            or (conversations or 1) < 1):
        raise InputError("prompt sizes and counts must be positive")
    indices = range(start + offset, start + offset + count)
    if prompt_set == "shared-prefix":
        return [_shared_prefix(i, seed, preamble_tokens, sizing, shares) for i in indices]
    if prompt_set == "mixed":
        return [_mixed(i, seed, preamble_tokens, sizing) for i in indices]
    per_round = conversations or max(1, math.ceil(count / turns))
    return [_multi_turn(i, seed, preamble_tokens, sizing, start, per_round, turns)
            for i in indices]


def prefix_groups(prompt_set: str, shares: tuple[float, ...] = ()) -> PrefixGroups | None:
    """A shared-prefix set's groups and their shares, as a row states them (None: one)."""
    if prompt_set != "shared-prefix" or len(shares) < 2:
        return None
    return PrefixGroups(groups=len(shares), shares=[round(s, 4) for s in shares])


# --- sizing with the model's own tokenizer ------------------------------------------------
Calibration = Generator[str, int, Sizing]


def calibrate(seed: int, preamble_tokens: int, source: str) -> Calibration:
    """Yield texts to count in the model's tokens; return the Sizing they give.

    First a long sample passage (tokens per word, for every document), then the shared
    preamble at a few word counts until it holds `preamble_tokens` tokens, or the closest
    count below it when no whole number of words lands on it (closest above when none is
    below). Drive it with `size_with` or the load generator's /tokenize driver.
    """
    counted = yield passage(random.Random(f"calibration:{seed}"), CALIBRATION_WORDS)
    sizing = Sizing(counted / CALIBRATION_WORDS, "tokenizer", source)
    words, tried = sizing.words(preamble_tokens), {}
    for _ in range(SIZING_STEPS):
        tried[words] = yield _passage_of(f"preamble:{seed}", words)
        gap = preamble_tokens - tried[words]
        if gap == 0:
            break
        step = round(gap / sizing.tokens_per_word) or (1 if gap > 0 else -1)
        if max(1, words + step) in tried:
            break
        words = max(1, words + step)
    best = best_fit(tried, preamble_tokens)
    return replace(sizing, exact=((seed, preamble_tokens, best, tried[best]),))


def best_fit(tried: dict[int, int], target: int) -> int:
    """The word count whose token count is closest to `target` without passing it (the
    smallest overshoot when every count passes it)."""
    under = [w for w, n in tried.items() if n <= target]
    if under:
        return max(under, key=lambda w: (tried[w], -w))
    return min(tried, key=lambda w: (tried[w], w))


def size_with(count: Callable[[str], int | None], seed: int, preamble_tokens: int,
              source: str) -> Sizing | None:
    """Run `calibrate` with a counting function (None from it: no sizing, returns None)."""
    steps = calibrate(seed, preamble_tokens, source)
    try:
        text = next(steps)
        while True:
            n = count(text)
            if n is None:
                return None
            text = steps.send(n)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
