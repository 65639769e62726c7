"""A level's requests as per-request lines (`records.requests.RequestLine`), in sending order.

Warm-up requests come first, marked `warmup`; every time is in seconds from the level's start
(its warm-up's start when it had one), so one file has one clock. A line keeps what was
measured (stamps, the server's usage, cached tokens, the failure and, through kvlab's proxy,
the failed leg and the proxy's timeline), the request's id and the server's, and what was
asked (the prompt's index, conversation and turn, the size asked of its sized text). No
statistic is computed here beyond one request's own inter-token gaps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from kvlab.loadgen import stats
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.runner import LevelResult
from kvlab.loadgen.workloads import Prompt
from kvlab.records import Gaps, RequestLine

NS = 1e9
Status = Literal["ok", "failed", "cancelled"]
DETAIL_CHARS = 200


def _since(stamp_ns: int, origin_ns: int) -> float | None:
    return round((stamp_ns - origin_ns) / NS, 6) if stamp_ns else None



def gaps(record: RequestRecord) -> Gaps | None:
    """The request's inter-token gaps: count, p50, p99, max (None for fewer than two chunks)."""
    values = stats.itl_s(record)
    if not values:
        return None
    return Gaps(n=len(values), p50=stats.round6(stats.percentile(values, 50)),
                p99=stats.round6(stats.percentile(values, 99)), max=stats.round6(max(values)))


def status_of(record: RequestRecord) -> Status:
    return "cancelled" if record.cancelled else "ok" if record.ok else "failed"


def line(record: RequestRecord, prompt: Prompt | None, *, number: int, level: int,
         repeat: int | None, warmup: bool, origin_ns: int) -> RequestLine:
    """One request's line; its timings only where the request succeeded."""
    ok = record.ok
    first = record.token_ns[0] if record.token_ns else 0
    return RequestLine(
        id=number, level=level, repeat=repeat, warmup=warmup,
        prompt_index=record.prompt_index,
        conversation=prompt.conversation if prompt else None,
        turn=prompt.turn if prompt else None,
        sent_s=_since(record.sent_ns, origin_ns), first_token_s=_since(first, origin_ns),
        end_s=_since(record.end_ns, origin_ns), schedule_lag_s=stats.round6(stats.lag_s(record)),
        ttft_s=stats.round6(stats.ttft_s(record)) if ok else None,
        ttft_answer_s=stats.round6(stats.ttft_answer_s(record)) if ok else None,
        ttft_reasoning_s=stats.round6(stats.ttft_reasoning_s(record)) if ok else None,
        tpot_s=stats.round6(stats.tpot_s(record)) if ok else None,
        itl_s=gaps(record) if ok else None,
        prompt_tokens_requested=prompt.document_tokens if prompt else None,
        prompt_tokens=record.prompt_tokens, cached_tokens=record.cached_tokens,
        output_tokens=record.output_tokens if ok else record.completion_tokens,
        status=status_of(record), http_status=record.status,
        error=record.error, error_detail=record.error_detail[:DETAIL_CHARS] or None,
        failed_leg=record.failed_leg, blank_output=record.blank_output or None,
        burst_read=(ok and stats.burst_read(record)) or None,
        request_id=record.request_id or None,
        response_id=record.response_id, timeline=stats.timeline(record),
    )


def level_lines(warm: LevelResult | None, measured: LevelResult,
                prompts: Mapping[int, Prompt], *, level: int,
                repeat: int | None) -> list[RequestLine]:
    """Every request of a level: the warm-up's (marked), then the measured ones."""
    origin = warm.start_ns if warm is not None else measured.start_ns
    phases: Iterable[tuple[bool, list[RequestRecord]]] = (
        (True, warm.records if warm is not None else []), (False, measured.records))
    out: list[RequestLine] = []
    for warmup, records in phases:
        for record in records:
            out.append(line(record, prompts.get(record.prompt_index), number=len(out),
                            level=level, repeat=repeat, warmup=warmup, origin_ns=origin))
    return out
