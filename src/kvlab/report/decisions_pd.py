"""The P/D lab's decision: which configuration you would actually use. Each split run is
judged against its own run's baseline (by its TTFT p50 at each level, with a 95% interval
where both sides have per-request files), the best one is chosen, and the answer says use it,
use one machine, or route by concurrency, with its TPOT and the boundary by prompt length; or
"not enough evidence" and why.

It does not add the capacities at the target or the user's own answer (`decisions.py`); the
split runs are `placement.py`'s groups. Nothing here measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Literal

from kvlab.measure import NOT_CROSSED, intervals, load_rows, paired_rows
from kvlab.records import (
    BASELINE,
    BOUNDARY,
    LOOPBACK,
    TWO_MACHINES,
    UNKNOWN,
    BoundaryRecord,
    ComparisonRecord,
    LoadRecord,
    Notebook,
)
from kvlab.report.common import latest
from kvlab.report.decisions_common import (
    Decision,
    Mark,
    Outcome,
    Panel,
    _absent,
    _undecided,
)
from kvlab.report.placement import Group, split_groups

PD_Q = "Which configuration would you actually use?"


@dataclass(frozen=True)
class Judged:
    group: Group
    ttft: list[tuple[int, intervals.Interval]]  # (concurrency, split/baseline TTFT p50)
    problem: str = ""

    def mean_ratio(self) -> float:
        return mean(iv.ratio for _, iv in self.ttft if iv.ratio is not None)


def configuration(book: Notebook) -> Decision:
    lab = "pd"
    base = load_rows(book.records, BASELINE.label)
    if not base:
        return _undecided(lab, PD_Q, _absent(book, BASELINE.label, "the single-machine baseline"))
    judged = [_judge(book, g, paired_rows(book.records, g.label, BASELINE.label)[1])
              for g in split_groups(book)]  # each split against its own run's baseline
    if not judged:
        return _undecided(lab, PD_Q, "no split run is in the notebook, so there is nothing to "
                                     "choose against the baseline")
    valid = [j for j in judged if not j.problem]
    if not valid:
        return _undecided(lab, PD_Q, "; ".join(j.problem for j in judged))
    best = min(valid, key=Judged.mean_ratio)
    boundary = latest(book, BoundaryRecord, BOUNDARY.label)
    return _pd_decision(best, judged, boundary)


def _judge(book: Notebook, group: Group, base: dict[int, LoadRecord]) -> Judged:
    name = _name(group)
    c = group.comparison
    if group.topology == UNKNOWN:
        return Judged(group, [], f"the topology of {name} was not recorded, so which "
                                 "configuration it measured is unknown")
    if c is None:
        return Judged(group, [], f"{name} has no comparison against the baseline (kvlab "
                                 "compare)")
    if c.same_experiment is False:
        return Judged(group, [], f"{name} is not the same experiment as the baseline ("
                                 + "; ".join(c.differences) + ")")
    if c.bytes is not None and c.bytes.verdict == NOT_CROSSED:
        return Judged(group, [], f"no KV moved in {name}: decode prefilled by itself")
    ttft = _ttft(book, group, c, base)
    if not ttft:
        return Judged(group, [], f"the comparison of {name} has no TTFT at any level")
    return Judged(group, ttft)


def _ttft(book: Notebook, group: Group, c: ComparisonRecord,
          base: dict[int, LoadRecord]) -> list[tuple[int, intervals.Interval]]:
    """The split's TTFT p50 over the baseline's at each level the comparison paired: from the
    per-request files with an interval where both sides have them, else the recorded ratio."""
    mine = {r.concurrency: r for r in group.rows}
    recorded = dict(_ratios(c, "ttft"))
    out = []
    for level in sorted(recorded):
        if level in mine and level in base:
            found = intervals.ttft(book.path, book.records, mine[level], base[level])
        else:
            found = intervals.Interval("ttft_p50", recorded[level])
        if found.ratio is not None:
            out.append((level, found))
    return out


def _ratios(c: ComparisonRecord, key: Literal["ttft", "tpot"]) -> list[tuple[int, float]]:
    """The comparison's recorded p50 ratios, split over baseline, by level."""
    out = []
    for lv in c.levels:
        d, b = ((lv.ttft_p50_disagg_s, lv.ttft_p50_baseline_s) if key == "ttft"
                else (lv.tpot_p50_disagg_s, lv.tpot_p50_baseline_s))
        if d is not None and b:
            out.append((lv.concurrency, d / b))
    return out


def _name(group: Group) -> str:
    where = {LOOPBACK: "on one machine", TWO_MACHINES: "across two machines"}.get(
        group.topology, group.topology)
    return f"the split `{group.label}` ({where}, {group.connector} connector)"


def _side(iv: intervals.Interval) -> str:
    """faster, slower or same: by the interval where there is one, else by the point."""
    if iv.spans_one:
        return "same"
    if iv.measured:
        return "faster" if iv.high is not None and iv.high < 1 else "slower"
    return "faster" if iv.ratio is not None and iv.ratio < 1 else "slower"


def _figure(level: int, iv: intervals.Interval) -> str:
    if iv.low is None or iv.high is None:
        return f"c={level} x{iv.ratio:.2f}"
    return f"c={level} x{iv.ratio:.2f} [{iv.low:.2f}, {iv.high:.2f}]"


def _level(found: list[tuple[int, intervals.Interval]]) -> str:
    """The level the intervals were read at (95%, or a sequential run's)."""
    return intervals.level_words(max((iv.confidence for _, iv in found),
                                     default=intervals.CONFIDENCE))


def _pd_decision(best: Judged, judged: list[Judged],
                 boundary: BoundaryRecord | None) -> Decision:
    c = best.group.comparison
    assert c is not None
    ttft = ", ".join(_figure(lv, iv) for lv, iv in best.ttft)
    by_side: dict[str, list[int]] = {"faster": [], "slower": [], "same": []}
    for level, iv in best.ttft:
        by_side[_side(iv)].append(level)
    faster, slower, same = by_side["faster"], by_side["slower"], by_side["same"]
    levels = "/".join(map(str, same))
    alike = f" and no measurably different at c={levels}" if same else ""
    chart = Panel("ratio", "TTFT p50, split / one machine", tuple(
        m for lv, iv in best.ttft if (m := Mark.of(f"c={lv}", iv)) is not None))
    if not faster and not slower:
        return _undecided("pd", PD_Q, f"the best split measured, {_name(best.group)}, made no "
                                      f"measurable difference to first token at any level "
                                      f"({_level(best.ttft)} intervals span 1: {ttft})"
                          ).charted(chart)
    outcome: Outcome = "choice"
    if faster and not slower and not same:
        head = f"Use {_name(best.group)}: its TTFT p50 against the baseline was {ttft}"
        short, outcome = f"Use the split `{best.group.label}`", "yes"
    elif not faster:
        head = (f"Use one machine, no split: the best split measured, {_name(best.group)}, "
                + ("was slower to first token at every level" if not same else
                   f"was slower to first token at c={'/'.join(map(str, slower))}{alike}")
                + f" ({ttft})")
        short, outcome = "Use one machine, no split", "no"
    else:
        short = (f"Route by concurrency: the split `{best.group.label}` at "
                 f"c={'/'.join(map(str, faster))}, one machine elsewhere")
        head = (f"Route by concurrency: {_name(best.group)} was faster to first token at "
                f"c={'/'.join(map(str, faster))}"
                + (" and slower elsewhere" if slower and not same else
                   f", slower at c={'/'.join(map(str, slower))}" if slower else "")
                + f"{alike} ({ttft})")
    return Decision("pd", PD_Q, f"{head} ({'; '.join(_notes(best, judged, boundary))}).", True,
                    f"TTFT {ttft}" if len(ttft) < 80 else "", (best.group.label,),
                    headline=short, outcome=outcome, chart=(chart,))


def _notes(best: Judged, judged: list[Judged], boundary: BoundaryRecord | None) -> list[str]:
    c = best.group.comparison
    assert c is not None
    tpot = ", ".join(f"c={lv} x{r:.2f}" for lv, r in _ratios(c, "tpot")) or "not measured"
    notes = [f"TPOT {tpot}"]
    unmeasured = {iv.words for _, iv in best.ttft if not iv.measured}
    if unmeasured:
        notes.append("TTFT " + "; ".join(sorted(unmeasured)) + ", so the ratios are points")
    if best.group.topology == LOOPBACK:
        notes.append("measured on one machine, which moves no KV over a network: a "
                     "two-machine split is not measured here")
    if boundary is not None and boundary.statement:  # the lab's routing boundary
        notes.append(f"by prompt length: {boundary.statement}")
    skipped = [j.problem for j in judged if j.problem]
    if skipped:
        notes.append("not considered: " + "; ".join(skipped))
    return notes
