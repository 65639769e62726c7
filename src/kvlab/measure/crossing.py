"""Where a candidate's TTFT against a reference crosses 1.0 along prompt length: the one
judgement the P/D lab's boundary step (the split against the one-instance baseline) and the
offload lab's (the host tier against none, by opening length) both make.

The judgement (`judge_crossing`) reads the candidate/reference ratio of TTFT p50 per length:
below 1.0 the candidate pays. One crossing gives the length where it starts (or stops) paying,
interpolated between the two measured lengths around it; no crossing says it pays everywhere
or nowhere in the range; more than one crossing is reported as mixed rather than as a
boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["pays-above", "pays-below", "pays-everywhere", "pays-nowhere", "mixed",
                  "not-enough-evidence"]


@dataclass(frozen=True)
class Point:
    """One length: the candidate's TTFT p50 and the reference's (the split and the baseline;
    the tier on and off)."""

    tokens: int
    split_s: float | None
    baseline_s: float | None
    ratio_given: float | None = None  # a ratio measured as such (pooled over repeats)
    pays_given: bool | None = None  # whether it pays, judged by an interval (None: ratio < 1)

    @property
    def pays(self) -> bool:
        if self.pays_given is not None:
            return self.pays_given
        return self.ratio is not None and self.ratio < 1.0

    @property
    def ratio(self) -> float | None:
        if self.ratio_given is not None:
            return self.ratio_given
        if self.split_s is None or not self.baseline_s:
            return None
        return self.split_s / self.baseline_s


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    statement: str
    crossing_tokens: float | None = None


def _crossing(a: Point, b: Point) -> float:
    """Where the ratio crosses 1.0 between two lengths, linearly interpolated (within them:
    a side judged by its interval may pay at a ratio that has not crossed 1.0)."""
    ra, rb = a.ratio, b.ratio
    assert ra is not None and rb is not None
    if ra == rb:
        return (a.tokens + b.tokens) / 2
    at = a.tokens + (1.0 - ra) * (b.tokens - a.tokens) / (rb - ra)
    return min(max(at, a.tokens), b.tokens)


def judge_crossing(points: Sequence[Point], subject: str = "the split",
          reference: str = "the baseline") -> Judgement:
    """Where `subject`'s TTFT ratio against `reference` crosses 1.0, in words and tokens."""
    measured = sorted((p for p in points if p.ratio is not None), key=lambda p: p.tokens)
    if len(measured) < 2:
        return Judgement("not-enough-evidence", "not enough evidence: fewer than two lengths "
                         "measured on both sides")
    ratios = ", ".join(f"x{p.ratio:.2f} at {p.tokens}" for p in measured)
    span = f"{measured[0].tokens}-{measured[-1].tokens} tokens"
    pays = [p.pays for p in measured]
    if all(pays):
        return Judgement("pays-everywhere", f"{subject} pays everywhere in the range ({span}): "
                         f"TTFT {ratios} of {reference}")
    if not any(pays):
        return Judgement("pays-nowhere", f"{subject} does not pay anywhere in the range "
                         f"({span}): TTFT {ratios} of {reference}")
    flips = [i for i in range(len(pays) - 1) if pays[i] != pays[i + 1]]
    at = [_crossing(measured[i], measured[i + 1]) for i in flips]
    if len(flips) > 1:
        where = ", ".join(f"{x:,.0f}" for x in at)
        return Judgement("mixed", f"no single boundary: the ratio crosses 1.0 {len(flips)} "
                         f"times (near {where} tokens); TTFT {ratios} of {reference}; "
                         "measure again with more requests per length")
    if pays[-1]:
        return Judgement("pays-above", f"{subject} pays above {at[0]:,.0f} tokens: TTFT "
                         f"{ratios} of {reference}", round(at[0], 1))
    return Judgement("pays-below", f"{subject} pays below {at[0]:,.0f} tokens and stops paying "
                     f"above it: TTFT {ratios} of {reference}", round(at[0], 1))


