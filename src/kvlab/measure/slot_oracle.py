"""The cache oracle for llama-server's slots: what its prompt cache could have served.

llama-server keeps, per slot, the tokens of the last prompt it processed, and reuses the
longest common prefix of those and the next prompt given to that slot, to the token (there are
no blocks). Which slot a request gets is its own rule (`get_available_slot` in its server):
among the idle slots that hold tokens, the one whose common prefix is the largest share of the
new prompt, if that share is above `--slot-prompt-similarity` (0.5 by default); otherwise the
idle slot used least recently. A request that finds no idle slot waits for the first to free.
At least one prompt token is always computed. The model replays a level's requests in the
order they were sent, each slot busy from a request's send to its end as measured.

Where it departs from the engine: a slot is taken to hold the prompt only (the generated
tokens it also keeps are not known here, which understates a conversation's next turn by
its reply), and the in-RAM prompt cache (`--cache-ram`, on by default) is not modelled: with
it on, the engine can serve more than this oracle by loading a saved prompt into a slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SIMILARITY_DEFAULT = 0.5  # llama-server's --slot-prompt-similarity


@dataclass(frozen=True)
class SlotRequest:
    """One request as sent: its prompt tokens, when it was sent and when it ended."""

    tokens: Sequence[int]
    sent_s: float
    end_s: float


@dataclass
class _Slot:
    tokens: Sequence[int] = ()
    busy_until: float = float("-inf")
    last_used: int = -1  # the replay's counter: llama-server's t_last_used, in order


@dataclass(frozen=True)
class SlotCache:
    """llama-server's slots: how many, and its similarity threshold (0 turns it off)."""

    slots: int
    similarity: float = SIMILARITY_DEFAULT

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("a llama-server has at least one slot")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _choose(slots: list[_Slot], prompt: Sequence[int], now: float,
            similarity: float) -> _Slot:
    """The slot llama-server gives `prompt` at `now` (waiting for the first to free when
    every slot is busy)."""
    idle = [s for s in slots if s.busy_until <= now]
    if not idle:
        first = min(s.busy_until for s in slots)
        idle = [s for s in slots if s.busy_until <= first]
    best, share = None, 0.0
    if similarity > 0 and prompt:
        for slot in idle:
            if slot.tokens:
                found = common_prefix(slot.tokens, prompt) / len(prompt)
                if found > share and found > similarity:
                    best, share = slot, found
    if best is not None:
        return best
    return min(idle, key=lambda s: s.last_used)


def replay(requests: Sequence[SlotRequest], cache: SlotCache) -> list[int]:
    """The prompt tokens each request could have found cached, in the order given (sent
    order)."""
    slots = [_Slot() for _ in range(cache.slots)]
    out: list[int] = []
    for n, request in enumerate(requests):
        slot = _choose(slots, request.tokens, request.sent_s, cache.similarity)
        reused = common_prefix(slot.tokens, request.tokens)
        out.append(max(0, min(reused, len(request.tokens) - 1)))
        slot.tokens, slot.busy_until, slot.last_used = request.tokens, request.end_s, n
    return out


def unbounded(requests: Sequence[SlotRequest]) -> list[int]:
    """What any earlier prompt could have served each request (a slot for every prompt):
    the bound no slot choice exceeds."""
    out: list[int] = []
    for i, request in enumerate(requests):
        best = max((common_prefix(p.tokens, request.tokens) for p in requests[:i]), default=0)
        out.append(max(0, min(best, len(request.tokens) - 1)))
    return out
