"""A reuse conversation fitted to the served context, counted in the model's own tokens.

`kvlab reuse` grows one conversation for N turns; its last turn carries the preamble, every
question and every answer so far. Word counts are a poor guide to tokens (a tiny BPE splits
words finer than an English one), so this counts with the served model's tokenizer (the
engine's /tokenize, through its adapter) and shrinks the preamble until the last turn, plus
its answer, fits the smallest context among the instances. What it did is returned as data,
for the run's first lines and its record.

Chat-template tokens are measured, not guessed: the instance's template tokens of the
compatibility probe conversation, less its contents' tokens, per message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx

from kvlab.core import server_root
from kvlab.engines import PROBE_MESSAGES, InstanceFacts, known_engine
from kvlab.measure.conversation import QUESTIONS, preamble
from kvlab.records import Fitted as FittedLine

TEMPLATE_TOKENS_GUESS = 8  # per message, when the instance cannot say
ANSWER_SLACK = 1.1  # an answer re-tokenised from its text can take a few more tokens
STEPS = 6


@dataclass(frozen=True)
class Fitted:
    """The preamble a run uses, and why."""

    preamble_words: int
    asked_words: int
    context_tokens: int | None
    last_turn_tokens: int | None  # the last turn's prompt, estimated with the fitted preamble
    counted_by: str

    def as_record(self) -> FittedLine:
        return FittedLine(preamble_words=self.preamble_words, asked_words=self.asked_words,
                          context_tokens=self.context_tokens,
                          last_turn_tokens=self.last_turn_tokens, counted_by=self.counted_by)

    def line(self, turns: int) -> str:
        """What was fitted, in one line."""
        if self.context_tokens is None or self.last_turn_tokens is None:
            return f"    preamble {self.preamble_words} words, not fitted: {self.counted_by}"
        fits = (f"turn {turns} about {self.last_turn_tokens:,} prompt tokens, within the served "
                f"context of {self.context_tokens:,} ({self.counted_by})")
        if self.preamble_words == self.asked_words:
            return f"    preamble {self.preamble_words} words: {fits}"
        return (f"    fitted: preamble {self.asked_words} -> {self.preamble_words} words so that "
                f"{fits}")


class _Counter:
    """Token counts of texts by one instance's tokenizer, remembered."""

    def __init__(self, client: httpx.AsyncClient, facts: InstanceFacts) -> None:
        self.client, self.facts = client, facts
        self.engine = known_engine(facts.engine or "")
        self.root = server_root(facts.url)
        self._seen: dict[str, int | None] = {}

    async def count(self, text: str) -> int | None:
        if text not in self._seen:
            tokens = (await self.engine.tokenize(self.client, self.root, text)
                      if self.engine is not None else None)
            self._seen[text] = len(tokens) if tokens is not None else None
        return self._seen[text]

    async def per_message(self) -> int:
        """Template tokens per message, from the instance's own templating of the probe."""
        template = self.facts.template_tokens
        counts = [await self.count(m["content"]) for m in PROBE_MESSAGES]
        if template is None or any(c is None for c in counts):
            return TEMPLATE_TOKENS_GUESS
        overhead = len(template) - sum(c for c in counts if c is not None)
        return max(1, math.ceil(overhead / len(PROBE_MESSAGES)))


async def fit_conversation(client: httpx.AsyncClient, instances: list[InstanceFacts],
                           words: int, nonce: str, turns: int,
                           max_tokens: int) -> Fitted:
    """The largest preamble (at most `words`) whose last turn fits every instance's context."""
    contexts = [f.max_model_len for f in instances if f.max_model_len]
    context = min(contexts) if contexts else None
    counter = _Counter(client, instances[0])
    where = f"counted with {instances[0].url.removesuffix('/v1')}/tokenize"
    if context is None or await counter.count(preamble(1, nonce)) is None:
        why = "no instance stated its context" if context is None else \
            "the instance's tokenizer did not answer"
        return Fitted(words, words, context, None, why)
    per_message = await counter.per_message()
    questions = [await counter.count(QUESTIONS[t % len(QUESTIONS)]) or 0 for t in range(turns)]
    answer = math.ceil(max_tokens * ANSWER_SLACK) + 1
    fixed = (sum(questions) + (turns - 1) * answer
             + per_message * (1 + turns + (turns - 1)))
    budget = context - max_tokens
    fitted, estimate = words, 0
    for _ in range(STEPS):
        estimate = fixed + (await counter.count(preamble(fitted, nonce)) or 0)
        if estimate <= budget or fitted <= 1:
            break
        room = max(1, budget - fixed)
        fitted = max(1, math.floor(fitted * room / (estimate - fixed) * 0.98))
    return Fitted(fitted, words, context, estimate, where)
