"""Repeats of a two-sided comparison, in alternating order: A B B A A B B A ...

Drift over a run (a machine warming up, a neighbour's load, a page cache filling) then
falls on both sides alike instead of favouring whichever side ran first. Consecutive runs
of one side share one stint of its engines (A | B B | A A | B): engines restart only where the
side changes, and each repeat's prompts are its own (`LoadSpec.repeat` picks a disjoint block),
so a repeat never finds the previous repeat's prompts in the cache.

Enough repeats, not more (`Sequential`): rounds (one repeat of every side) are added until
the interval of the ratio under test settles, with a cap. After each round from the second
on (Welch's between-repeat interval needs two a side), the run stops when the interval
excludes 1 (a difference is shown), when it is narrower than `WIDTH` (high/low 1.2: the ratio
is known to about +-9%, finer than any decision the labs take from it, whose thresholds are
"within 90% of the best gain" and "faster or not"), or at the cap. Looking at the interval
after every round and stopping on what it shows is optional stopping: a 95% interval read
up to `cap - 1` times would miss the true ratio more often than 5% of the time. So each look
reads the interval at 1 - 0.05 / looks (Bonferroni over the looks the cap allows: 97.5% for
a cap of 3, 98.75% for 5): the chance that any look's interval misses is at most 5%, so the
interval the run stops on covers the ratio with at least 95%, whichever look it stopped at.
That is conservative (the looks are correlated, so the true level is above 95%), and the
interval is reported at the level it was read at, with the rule, so it stays honest.
`--repeat auto[:CAP]` asks for it (`asked`; the cap 5 unless given); `rounds.py` runs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvlab.core import InputError

FAMILY_ERROR = 0.05  # over every look a sequential run may take
WIDTH = 1.2  # high / low: settled enough to stop
MIN_ROUNDS = 2  # the between-repeat interval needs two repeats a side
DEFAULT_CAP = 5
AUTO = "auto"


@dataclass(frozen=True)
class Stint:
    """One start of a side's engines and the repeats measured before they stop."""

    side: int  # 0: the side that goes first (A), 1: the other (B)
    repeats: Iterable[int | None]  # None: the only run (no --repeat), rows carry no number;
    # a sequential run's are given one at a time, and end where its rule stops it
    first: bool  # this side's first stint: the one-off steps (checks, capacity) run here


def order(count: int, sides: int = 2) -> list[tuple[int, int]]:
    """(side, repeat) in the order they run: A0 B0 B1 A1 A2 B2 ... (with three sides,
    A0 B0 C0 C1 B1 A1 ...)."""
    _check(count)
    forward = list(range(sides))
    return [(side, r) for r in range(count)
            for side in (forward if r % 2 == 0 else forward[::-1])]


def stints(count: int, sides: int = 2) -> list[Stint]:
    """`order(count, sides)` grouped into stints: consecutive runs of one side
    together."""
    out: list[Stint] = []
    seen: set[int] = set()
    for side, repeat in order(count, sides):
        number = repeat if count > 1 else None
        if out and out[-1].side == side:
            last = out.pop()
            out.append(Stint(side, (*last.repeats, number), last.first))
            continue
        out.append(Stint(side, (number,), side not in seen))
        seen.add(side)
    return out


def one_side(count: int) -> tuple[int | None, ...]:
    """The repeat numbers of a single-sided run (`kvlab run-load --repeat N`)."""
    _check(count)
    return tuple(range(count)) if count > 1 else (None,)


def _check(count: int) -> None:
    if count < 1:
        raise InputError(f"--repeat {count}: give at least 1")


def asked(text: str) -> int | Sequential:
    """`--repeat`: N repeats a side, or `auto` / `auto:CAP`: rounds until the interval
    settles, at most CAP (DEFAULT_CAP)."""
    word, colon, cap = text.strip().partition(":")
    if word == AUTO and not colon:
        return Sequential(DEFAULT_CAP)
    if word == AUTO and cap.isdigit():
        return Sequential(int(cap))
    if word.isdigit() and not colon and int(word) >= 1:
        return int(word)
    raise InputError(f"--repeat {text!r}: give a number of repeats (1 or more), or auto or "
                     f"auto:CAP (rounds until the interval settles, at most CAP, {MIN_ROUNDS} "
                     f"or more; {DEFAULT_CAP} unless given)")


def numbered(repeat: int, count: int, rule: Sequential | None = None) -> str:
    """`repeat 2 of 3`; in a sequential run `repeat 2 of at most 5`."""
    return f"repeat {repeat + 1} of {'at most ' if rule else ''}{count}"


@dataclass(frozen=True)
class Sequential:
    """The stopping rule of a run whose repeats continue until its interval settles."""

    cap: int  # rounds at most

    def __post_init__(self) -> None:
        if self.cap < MIN_ROUNDS:
            raise InputError(f"--repeat {AUTO}:{self.cap}: give a cap of at least {MIN_ROUNDS} "
                             "rounds (the between-repeat interval needs two repeats a side)")

    @property
    def looks(self) -> int:
        """How many times the interval may be read: after rounds MIN_ROUNDS..cap."""
        return self.cap - MIN_ROUNDS + 1

    @property
    def confidence(self) -> float:
        """Each look's level, so that all of them together miss at most FAMILY_ERROR."""
        return 1 - FAMILY_ERROR / self.looks

    def verdict(self, rounds: int, low: float | None, high: float | None) -> str | None:
        """Why the run stops after `rounds` complete rounds with this interval (None: go
        on)."""
        if rounds < MIN_ROUNDS:
            return None
        if low is not None and high is not None and low > 0:
            if not low <= 1.0 <= high:
                return f"the interval excluded 1 after {rounds} rounds"
            if high / low <= WIDTH:
                return f"the interval was narrower than {WIDTH:g}x after {rounds} rounds"
        return f"the cap of {self.cap} rounds" if rounds >= self.cap else None

    def rule(self) -> str:
        """The rule, as the row states it."""
        return (f"sequential: after each round from {MIN_ROUNDS} to {self.cap}, stop when the "
                f"{100 * self.confidence:.2f}% interval (Bonferroni over {self.looks} looks: "
                f"at least 95% over all) excludes 1 or is narrower than {WIDTH:g}x")
