"""The text of kvlab's reuse measurements: a stable preamble, questions, a growing chat.

The preamble is identical on every run of a given length (so a second run can hit what a
first one cached), unless a `nonce` is given, which changes its first words (so a "cold"
request is really cold, and a control really differs at position zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the seed's measure-reuse.py sizes: PREAMBLE_WORDS' default and its --max-tokens per turn
PREAMBLE_WORDS = 1500
TURN_MAX_TOKENS = 48

PREAMBLE = (
    "Every token an engine reads leaves a key vector and a value vector in each layer.",
    "Keeping those vectors means the next request with the same opening need not read it again.",
    "The match is on token identifiers and must begin at the very first token of the prompt.",
    "A cache that holds whole blocks can only hand back whole blocks of a shared opening.",
    "Host memory can hold blocks that no longer fit on the device, at the price of a copy.",
    "A file on disk can keep a conversation warm while the serving process restarts.",
    "Two engines can share one store so that one of them reads what the other computed.",
    "A miss costs nothing visible: the engine quietly computes the prompt again and answers.",
    "Counters say what the engine believes it reused, and the clock says whether it helped.",
    "A changed first word is the control, since nothing after it can match the cache.",
    "Pressure is the condition: a tier that is never needed is never exercised.",
    "Quantised keys and values change the numbers, so compare them only with their own kind.",
)

QUESTIONS = (
    "In one sentence, what decides whether a prefix can be reused?",
    "In one sentence, why must the match begin at the first token?",
    "In one sentence, when does a host-memory tier start to matter?",
    "In one sentence, what does a shared store give a second engine?",
    "In one sentence, how would you notice a silent cache miss?",
    "In one sentence, what does a disk tier save after a restart?",
    "In one sentence, why is warm-up not the same as reuse?",
    "In one sentence, what is the control in a reuse experiment?",
)


def preamble(words: int, nonce: str = "") -> str:
    """About `words` words of stable text; a nonce changes the first words only."""
    out: list[str] = [f"Session {nonce}." if nonce else ""]
    count, i = 0, 0
    while count < words:
        sentence = PREAMBLE[i % len(PREAMBLE)]
        out.append(sentence)
        count += len(sentence.split())
        i += 1
    return " ".join(part for part in out if part)


@dataclass
class Conversation:
    """A chat that grows by one question and one answer per turn."""

    system: str
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [{"role": "system", "content": self.system}]

    def ask(self, turn: int, context_words: int = 0) -> list[dict[str, str]]:
        """Add turn `turn`'s question (0-based), after `context_words` words of added context
        when given, and return the messages to send."""
        question = QUESTIONS[turn % len(QUESTIONS)]
        if context_words:
            question = preamble(context_words, f"note {turn}") + " " + question
        self.messages.append({"role": "user", "content": question})
        return list(self.messages)

    def answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})
