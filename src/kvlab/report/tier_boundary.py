"""vLLM's host tier against the opening's length (`kvlab run offload --part boundary`), from the
notebook: at each length the tier-on runs' TTFT p50 against the tier-off runs' (repeats
pooled, the 95% interval from the per-request files), where the tier starts paying
(`measure.crossing.judge_crossing`, a length paying only where its interval lies below
1), and beside
it the arithmetic that predicts it: recalling a token costs its KV bytes over the host-to-device
rate vLLM's own counters measured (`vllm:kv_offload_load_bytes` over `_time`), recomputing it
one over the prefill rate the tier-off runs' first turns measured (their prompt tokens over
their TTFT: nothing but the system line is cached on a first turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from kvlab.measure import Judgement, Point, intervals, judge_crossing
from kvlab.records import OFFLOAD_BOUNDARY, LoadRecord, Notebook, NotRunRecord, requests
from kvlab.report.tier_curve import newest_run

SUBJECT, REFERENCE = "the host tier", "the tier off"


@dataclass(frozen=True)
class Length:
    """One opening length: its runs each side, TTFT on / off, the two rates."""

    tokens: int
    off: tuple[LoadRecord, ...]
    on: tuple[LoadRecord, ...]
    ttft: intervals.Interval | None
    prefill_tokens_per_s: float | None
    recall_bytes_per_s: float | None
    bytes_per_token: float | None

    @property
    def recompute_us(self) -> float | None:
        """Microseconds to recompute one prompt token."""
        return 1e6 / self.prefill_tokens_per_s if self.prefill_tokens_per_s else None

    @property
    def recall_us(self) -> float | None:
        """Microseconds to bring one token's KV back from the host."""
        if not self.recall_bytes_per_s or not self.bytes_per_token:
            return None
        return 1e6 * self.bytes_per_token / self.recall_bytes_per_s

    def point(self) -> Point:
        iv = self.ttft
        return Point(self.tokens, None, None, iv.ratio if iv else None,
                     None if iv is None or iv.spans_one is None
                     else bool(iv.high is not None and iv.high < 1))


def _planned(row: LoadRecord) -> tuple[int, int, float | None]:
    planned = row.pressure.planned if row.pressure is not None else None
    if planned is None:
        return 0, 0, None
    return planned.preamble_tokens or 0, planned.host_tier_bytes or 0, planned.bytes_per_token


def lengths(book: Notebook) -> list[Length]:
    """The newest boundary run's lengths, shortest first."""
    by: dict[int, tuple[list[LoadRecord], list[LoadRecord]]] = {}
    per_token: float | None = None
    for row in newest_run(book, OFFLOAD_BOUNDARY.label):
        tokens, tier, per_token = _planned(row)
        by.setdefault(tokens, ([], []))[1 if tier else 0].append(row)
    out = []
    for tokens, (off, on) in sorted(by.items()):
        ttft = (intervals.between_rows(book.path, on, off, (intervals.BY_KEY["ttft_p50"],))
                ["ttft_p50"] if off and on else None)
        out.append(Length(tokens, tuple(off), tuple(on), ttft, prefill_rate(book, off),
                          recall_rate(on), per_token))
    return out


def prefill_rate(book: Notebook, rows: tuple[LoadRecord, ...] | list[LoadRecord]
                 ) -> float | None:
    """Prompt tokens a second on the tier-off runs' first turns (the median over them)."""
    rates = []
    for row in rows:
        for line in requests.of_row(book.path, row.requests_file, row.requests_sha256) or ():
            if line.status == "ok" and not line.warmup and line.turn == 0 and line.ttft_s \
                    and line.prompt_tokens:
                rates.append(line.prompt_tokens / line.ttft_s)
    return median(rates) if rates else None


def recall_rate(rows: tuple[LoadRecord, ...] | list[LoadRecord]) -> float | None:
    """Host-to-device bytes a second, from the tier's own load counters over the runs."""
    moved = sum(float(r.metric_deltas.get("offload_load_bytes") or 0) for r in rows)
    took = sum(float(r.metric_deltas.get("offload_load_s") or 0) for r in rows)
    return moved / took if moved and took else None


def judgement(found: list[Length]) -> Judgement:
    return judge_crossing([f.point() for f in found], SUBJECT, REFERENCE)


def arithmetic(found: list[Length]) -> str:
    """Recall against recompute per token at each length, in words ("" without figures)."""
    said = []
    for f in found:
        recall, recompute = f.recall_us, f.recompute_us
        if recompute is None:
            continue
        if recall is None:
            said.append(f"{f.tokens:,}: recompute {recompute:.2f} us a token")
            continue
        cheaper = "cheaper" if recall < recompute else "dearer"
        said.append(f"{f.tokens:,}: recall {recall:.2f} us a token against recompute "
                    f"{recompute:.2f} ({cheaper})")
    if not said:
        return ""
    return ("the arithmetic (a token's KV bytes over the host-to-device rate vLLM's load "
            "counters measured, against one over the prefill rate of the tier-off first "
            "turns), by opening: " + "; ".join(said))


def unrun(book: Notebook, found: list[Length]) -> str | None:
    """The reason the newest boundary run gave for its tier-on side, if it gave one."""
    run = found[0].off[0].run_id if found and found[0].off else None
    return next((r.reason for r in reversed(book.records) if isinstance(r, NotRunRecord)
                 and r.label == OFFLOAD_BOUNDARY.label and r.run_id == run), None)
