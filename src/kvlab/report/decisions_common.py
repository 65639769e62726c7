"""What every closing decision of the report shares: the `Decision` itself (its answer, its
headline, which way it came out, and the figures its chart draws: `Panel`, `Mark`), the words
of an undecided one ("Not enough evidence" and why), why a run is absent (not run here, or no
line), and how close to 1 a ratio without an interval must be to be no difference.

It decides nothing and asks no question: the questions are in `decisions_host.py`,
`decisions_tiers.py` and `decisions_pd.py`, and their order in `decisions.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from kvlab.records import Notebook
from kvlab.report.common import not_run

NOT_ENOUGH = "Not enough evidence"
SAME_WITHIN = 0.10  # without an interval, a TTFT ratio within 10% of 1 is no difference
HEADLINE_LIMIT = 100  # characters of a headline: the first screen holds every decision

# which way a decided answer came out: the thing asked about paid (or is the one to use), it
# did not (it cost time, or the answer is not to use it), or the answer is a choice or a
# trade-off with no yes or no in it; an undecided answer has none of these
Outcome = Literal["yes", "no", "choice"]
Scale = Literal["ratio", "seconds", "share"]


class Ratio(Protocol):
    """A ratio with its interval, as `measure.intervals.Interval` holds one."""

    @property
    def ratio(self) -> float | None: ...
    @property
    def low(self) -> float | None: ...
    @property
    def high(self) -> float | None: ...


@dataclass(frozen=True)
class Mark:
    """One figure of a decision's chart: a value and its interval, where it has one."""

    name: str  # short: the chart's row label
    value: float
    low: float | None = None
    high: float | None = None
    chosen: bool = False  # the one the answer picks (its label is drawn bold)

    @staticmethod
    def of(name: str, iv: Ratio) -> Mark | None:
        """A ratio's mark (None: the interval has no ratio)."""
        if iv.ratio is None:
            return None
        return Mark(name, iv.ratio, iv.low, iv.high)


@dataclass(frozen=True)
class Panel:
    """One axis of a decision's chart: ratios (a log axis around 1, below 1 is `below`),
    seconds or shares, each mark a row."""

    scale: Scale
    title: str  # what the axis measures ("TTFT p50, tier on / off")
    marks: tuple[Mark, ...]
    below: str = "faster"  # a ratio under 1, in words
    above: str = "slower"


@dataclass(frozen=True)
class Decision:
    lab: str
    question: str
    answer: str
    decided: bool  # False: the rows do not decide it, and `answer` says why
    figure: str = ""  # the figure the answer rests on, short (a ratio and its interval)
    rows: tuple[str, ...] = ()  # the labels of the report rows behind it
    yours: str = ""  # the user's own answer (`kvlab note`), beside kvlab's draft
    headline: str = ""  # the answer in one short whole sentence ("": its first clause)
    outcome: Outcome = "choice"  # which way it came out (read only when decided)
    chart: tuple[Panel, ...] = ()  # the figures it rests on, drawn beside it

    def as_dict(self) -> dict[str, str | bool]:
        return {"lab": self.lab, "question": self.question, "answer": self.answer,
                "headline": self.head, "decided": self.decided,
                "outcome": self.outcome if self.decided else "undecided",
                "figure": self.figure, "yours": self.yours}

    @property
    def head(self) -> str:
        """The headline: the one given, else the answer's first clause."""
        return self.headline or first_clause(self.answer)

    def extended(self, words: str) -> Decision:
        """The same decision with `words` said after its answer."""
        return replace(self, answer=f"{self.answer.rstrip('.')}. {words}.")

    def charted(self, *panels: Panel) -> Decision:
        """The same decision with `panels` added to its chart (those with marks); a panel
        titled as one it has adds its marks to that one."""
        chart = list(self.chart)
        for panel in (p for p in panels if p.marks):
            at = next((i for i, p in enumerate(chart) if p.title == panel.title), None)
            if at is None:
                chart.append(panel)
            else:
                chart[at] = replace(chart[at], marks=(*chart[at].marks, *panel.marks))
        return replace(self, chart=tuple(chart))


def first_clause(answer: str, limit: int = HEADLINE_LIMIT) -> str:
    """An answer's first clause, as a whole phrase: cut at its first ": " or "; ", a
    parenthesis left out whole, and where that is still over `limit` characters, cut at its
    last ", " that fits (a word cut only where there is none)."""
    first = re.split(r": |; ", answer, maxsplit=1)[0].rstrip(". ")
    first = re.sub(r" \([^()]*\)", "", first)
    first = first.split(" (")[0]  # a parenthesis the cut left open
    if len(first) > limit:
        clause = first[:limit].rsplit(", ", 1)[0]
        first = clause if clause != first[:limit] else \
            first[:limit].rsplit(" ", 1)[0].rstrip(",;:·-")
    return first


def _undecided(lab: str, question: str, why: str) -> Decision:
    said = f"{NOT_ENOUGH}: "
    return Decision(lab, question, f"{said}{why}.", False,
                    headline=said + first_clause(why, HEADLINE_LIMIT - len(said)))


def _absent(book: Notebook, label: str, what: str) -> str:
    skipped = not_run(book, label)
    if skipped:
        return f"{what} was not run here ({skipped.reason})"
    return f"{what} is not in the notebook (no `{label}` line)"
