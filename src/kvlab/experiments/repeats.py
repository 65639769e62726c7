"""Repeats of a two-sided comparison, in alternating order: A B B A A B B A ...

Drift over a run (a machine warming up, a neighbour's load, a page cache filling) then
falls on both sides alike instead of favouring whichever side ran first. Consecutive runs
of one side share one stint of its engines (A | B B | A A | B): engines restart only where the
side changes, and each repeat's prompts are its own (`LoadSpec.repeat` picks a disjoint block),
so a repeat never finds the previous repeat's prompts in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.errors import InputError


@dataclass(frozen=True)
class Stint:
    """One start of a side's engines and the repeats measured before they stop."""

    side: int  # 0: the side that goes first (A), 1: the other (B)
    repeats: tuple[int | None, ...]  # None: the only run (no --repeat), rows carry no number
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
