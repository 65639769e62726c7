"""What every closing decision of the report shares: the `Decision` itself, the words of an
undecided one ("Not enough evidence" and why), why a run is absent (not run here, or no line),
and how close to 1 a ratio without an interval must be to be no difference.

It decides nothing and asks no question: the questions are in `decisions_host.py`,
`decisions_tiers.py` and `decisions_pd.py`, and their order in `decisions.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvlab.records import Notebook
from kvlab.report.common import not_run

NOT_ENOUGH = "Not enough evidence"
SAME_WITHIN = 0.10  # without an interval, a TTFT ratio within 10% of 1 is no difference


@dataclass(frozen=True)
class Decision:
    lab: str
    question: str
    answer: str
    decided: bool  # False: the rows do not decide it, and `answer` says why
    figure: str = ""  # the figure the answer rests on, short (a ratio and its interval)
    rows: tuple[str, ...] = ()  # the labels of the report rows behind it
    yours: str = ""  # the user's own answer (`kvlab note`), beside kvlab's draft

    def as_dict(self) -> dict[str, str | bool]:
        return {"lab": self.lab, "question": self.question, "answer": self.answer,
                "decided": self.decided, "figure": self.figure, "yours": self.yours}

    def extended(self, words: str) -> Decision:
        """The same decision with `words` said after its answer."""
        return replace(self, answer=f"{self.answer.rstrip('.')}. {words}.")


def _undecided(lab: str, question: str, why: str) -> Decision:
    return Decision(lab, question, f"{NOT_ENOUGH}: {why}.", False)


def _absent(book: Notebook, label: str, what: str) -> str:
    skipped = not_run(book, label)
    if skipped:
        return f"{what} was not run here ({skipped.reason})"
    return f"{what} is not in the notebook (no `{label}` line)"
