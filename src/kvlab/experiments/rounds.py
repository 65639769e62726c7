"""A two-sided comparison's repeats as a loop: a fixed count (`--repeat N`), or rounds until
the interval settles (`--repeat auto[:CAP]`, `repeats.Sequential`).

`Rounds.stints()` gives the stints `repeats.stints` makes (A | B B | A A | B ...), each
stint's repeats one at a time. In a sequential run `writer` wraps how the rows are written:
each row of the two sides' labels carries the rule and its level as it is written, and the
row that completes a round (every level of both sides then has as many repeats as there are
rounds) first has the ratio read with the rows before it: TTFT p50, `top` over `bottom`, at
every level, at the rule's level (`intervals.between_rows`), then `Sequential.verdict`. The
rows are appended to the notebook as they are measured, so the stop goes on that row
(`repeat_stop`), the one it was decided on, and no repeat starts after it. A round ends
inside a stint (a side's last run of one round and its first of the next share an engine
start), so a stop ends that stint after its first repeat. With several levels the run stops
once every level's interval has settled, or at the cap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvlab.experiments import repeats
from kvlab.experiments.lab import Lab
from kvlab.experiments.repeats import MIN_ROUNDS, Sequential, Stint
from kvlab.measure import intervals
from kvlab.records import LoadRecord, Record

Write = Callable[[Record], object]


def _quiet(_: str) -> None:
    return None


@dataclass
class Rounds:
    """The runs of a two-sided comparison, and (with `rule`) when to stop them."""

    count: int  # repeats a side; a sequential run's cap
    rule: Sequential | None = None
    notebook: Path = Path()  # where the rows' per-request files are found
    top: str = ""  # the label whose TTFT p50 is over the other's
    bottom: str = ""
    say: Callable[[str], object] = _quiet
    rows: list[LoadRecord] = field(default_factory=list)  # the two sides', as written
    done: int = 0  # complete rounds
    stop: str | None = None

    def stints(self) -> Iterator[Stint]:
        if self.rule is None:
            yield from repeats.stints(self.count)
            return
        for stint in repeats.stints(self.rule.cap):
            if self.stop is not None:
                return
            yield replace(stint, repeats=self._until_stopped(stint.repeats))

    def _until_stopped(self, numbers: Iterable[int | None]) -> Iterator[int | None]:
        for number in numbers:
            if self.stop is not None:
                return
            yield number

    def numbered(self, repeat: int) -> str:
        return repeats.numbered(repeat, self.count, self.rule)

    def writer(self, write: Write) -> Write:
        """`write`, with each of the two sides' rows stamped with the rule first."""
        if self.rule is None:
            return write

        def stamped(line: Record) -> object:
            if isinstance(line, LoadRecord) and line.label in (self.top, self.bottom) \
                    and line.repeat is not None:
                self._take(line)
            return write(line)

        return stamped

    def _take(self, row: LoadRecord) -> None:
        assert self.rule is not None
        row.repeat_rule, row.repeat_confidence = self.rule.rule(), self.rule.confidence
        self.rows.append(row)
        rounds = complete_rounds(self.rows, (self.top, self.bottom))
        if rounds > self.done:
            self.done = rounds
            self.stop = row.repeat_stop = self._verdict(rounds)
            if self.stop is not None:
                self.say(f"    sequential: stopped after {rounds} rounds: {self.stop}")

    def _verdict(self, rounds: int) -> str | None:
        """Why the run stops after `rounds` rounds (None: another round)."""
        assert self.rule is not None
        if rounds < MIN_ROUNDS:
            return None
        said = {}
        for level, iv in self.ratios().items():
            self.say(f"    round {rounds}, c={level}: TTFT p50 {self.top} / {self.bottom} "
                     f"{iv.cell()}")
            said[level] = self.rule.verdict(rounds, iv.low, iv.high)
        if not said:
            return self.rule.verdict(rounds, None, None)
        if any(why is None for why in said.values()):
            return None
        if len(said) == 1:
            return next(iter(said.values()))
        return "; ".join(f"c={level}: {why}" for level, why in said.items())

    def ratios(self) -> dict[int, intervals.Interval]:
        """TTFT p50 `top` / `bottom` at each level, from the rows so far, at the rule's
        level."""
        assert self.rule is not None
        ttft = (intervals.BY_KEY["ttft_p50"],)
        return {level: intervals.between_rows(
            self.notebook, self._side(self.top, level), self._side(self.bottom, level), ttft,
            self.rule.confidence)["ttft_p50"]
            for level in sorted({r.concurrency for r in self.rows})}

    def _side(self, label: str, level: int) -> list[LoadRecord]:
        return [r for r in self.rows if r.label == label and r.concurrency == level]


def for_pair(lab: Lab, count: int, rule: Sequential | None, top: str, bottom: str) -> Rounds:
    """A lab's two-sided runs: `count` repeats a side, or (with `rule`) rounds until TTFT p50
    `top` over `bottom` settles, read from the lab's notebook."""
    if rule is None:
        return Rounds(count)
    return Rounds(count, rule, Path(lab.settings.labbook), top, bottom, lab.say)


def complete_rounds(rows: Sequence[LoadRecord], labels: tuple[str, str]) -> int:
    """Rounds every level of both sides has run: the fewest repeats of any side's level."""
    levels = {r.concurrency for r in rows}
    return min((len({r.repeat for r in rows if r.label == label and r.concurrency == level})
                for label in labels for level in levels), default=0)
