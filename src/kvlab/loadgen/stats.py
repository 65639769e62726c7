"""Statistics over request records: pure functions, successes only, failures counted apart.

Definitions (all stamps are `perf_counter_ns` on the client):
- TTFT   = first output chunk's arrival - request sent, a token of either kind, answer or
           reasoning (`observe/sse.py` holds the one definition); TTFT answer and TTFT
           reasoning time the first of each kind apart.
- TTFT parts (through kvlab's proxy) = the proxy's prefill, hand-over, decode and proxy
           times for the request (`proxy/app.py`); to token = the first token's arrival - the
           answer's first event's (counted with decode); wire = TTFT - all of them. Each
           part's mean over the requests that carry them, so the means add up to the mean
           TTFT. Each part is a duration on one clock (the proxy's or the client's), so no
           clock offset between them enters; wire >= 0 always holds.
- TPOT   = (last output chunk's arrival - first output chunk's arrival) / (output tokens - 1),
           output tokens from the server's `usage`; undefined for a one-token response.
- ITL    = gaps between consecutive output chunks' arrivals (a chunk may carry several tokens).
- E2E    = response end - request sent.
- lag    = request sent - the moment the schedule released it (client-side delay).
- output tokens/s = sum of successes' output tokens / level wall time, where the wall time runs
           from the level's start to the last response's end; requests/s likewise.
- goodput = successes meeting every SLO bound / level wall time.
Percentiles interpolate linearly between closest ranks (numpy's default, "linear"):
rank = q/100 x (n - 1), value = v[floor] + (v[ceil] - v[floor]) x (rank - floor).
Every summary carries its sample count `n` beside the percentiles (a p99 of 24 values is the
slowest one but a quarter), and `std` is the sample standard deviation (n - 1 divisor; None
for one value). Warm-up requests never reach these functions: they run as their own phase.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from kvlab.core import InputError, integer
from kvlab.loadgen import slo
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.runner import LevelResult
from kvlab.records import (
    CachedTokens,
    Deltas,
    Failure,
    Goodput,
    LevelFigures,
    Percentiles,
    ProxyTimeline,
    TtftAccount,
    TtftParts,
)

NS = 1e9
# tokens of one answer closer than this on average were not decoded that close: 10,000 tokens
# a second from one sequence is several times what the fastest serving stacks decode one
# stream at, and a client parsing a buffered burst stamps its events tens of µs apart
BURST_S_PER_TOKEN = 100e-6
QUANTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def summary(values: Sequence[float]) -> Percentiles | None:
    """p50/p90/p95/p99/mean/std/min/max of `values` (seconds) and their count `n`, or None
    when there are none."""
    if not values:
        return None
    p50, p90, p95, p99 = (round(percentile(values, q), 6) for q in QUANTILES)
    return Percentiles(p50=p50, p90=p90, p95=p95, p99=p99,
                       mean=round(statistics.fmean(values), 6), min=round(min(values), 6),
                       max=round(max(values), 6),
                       std=round(statistics.stdev(values), 6) if len(values) > 1 else None,
                       n=len(values))


def ttft_s(r: RequestRecord) -> float:
    return (r.token_ns[0] - r.sent_ns) / NS


def ttft_answer_s(r: RequestRecord) -> float | None:
    return (r.answer_ns - r.sent_ns) / NS if r.answer_ns else None


def ttft_reasoning_s(r: RequestRecord) -> float | None:
    return (r.reasoning_ns - r.sent_ns) / NS if r.reasoning_ns else None


PARTS = ("prefill", "handover", "decode", "proxy")


def timeline(r: RequestRecord) -> ProxyTimeline | None:
    """The proxy's timeline of a successful request, when it sent one naming this request;
    the client adds the wait from the answer's first event to its first token, and the rest
    of its TTFT is the wire."""
    got = r.timeline
    if not r.ok or got is None or got.get("id") != r.request_id or not r.first_event_ns:
        return None
    ns = [integer(got.get(f"{part}_ns")) for part in PARTS]
    if any(v is None or v < 0 for v in ns):
        return None
    prefill, handover, decode, proxy = (v or 0 for v in ns)
    to_token = r.token_ns[0] - r.first_event_ns
    wire = r.token_ns[0] - r.sent_ns - to_token - prefill - handover - decode - proxy
    s = [round(v / NS, 6) for v in (prefill, handover, decode, proxy, to_token, wire)]
    return ProxyTimeline(prefill_s=s[0], handover_s=s[1], decode_s=s[2], proxy_s=s[3],
                         to_token_s=s[4], wire_s=s[5])


HISTOGRAMS = ("the engine's request-time histograms on /metrics (queue, prefill, time to "
              "first token), their increase over the level")
TIMINGS = "each response's timings.prompt_ms (the engine's time computing the prompt)"
NO_QUEUE = ("waiting for a slot and the engine's own TTFT are not in its per-response timings: "
            "`outside` holds the wait, the front end and the wire")


def ttft_account(ok: Sequence[RequestRecord], deltas: Deltas) -> TtftAccount | None:
    """Where the level's TTFT went by the engine's own accounts: its request-time histograms'
    increase over the level, else its per-response prompt timings (None: it reports
    neither, or nothing succeeded)."""
    if not ok:
        return None
    client = round(sum(ttft_s(r) for r in ok) / len(ok), 6)

    def mean(part: str) -> float | None:
        total, count = deltas.get(f"engine_{part}_s"), deltas.get(f"engine_{part}_n")
        return total / count if total is not None and count else None

    queue, prefill, engine = mean("queue"), mean("prefill"), mean("ttft")
    if queue is not None and prefill is not None:
        inside = engine if engine is not None else queue + prefill
        return TtftAccount(source=HISTOGRAMS, requests=int(deltas.get("engine_prefill_n") or 0),
                           client_ttft=client, queue=round6(queue), prefill=round6(prefill),
                           engine_ttft=round6(engine), outside=round6(client - inside))
    timed = [r.server_prompt_ms / 1e3 for r in ok if r.server_prompt_ms is not None]
    if not timed:
        return None
    prompt = sum(timed) / len(timed)
    return TtftAccount(source=TIMINGS, requests=len(timed), client_ttft=client,
                       prefill=round6(prompt), outside=round6(client - prompt),
                       not_reported=NO_QUEUE)


def round6(value: float | None) -> float | None:
    """A figure in seconds to the microsecond, as the rows keep them (None stays None)."""
    return round(value, 6) if value is not None else None


def ttft_parts(ok: Sequence[RequestRecord]) -> TtftParts | None:
    """The mean of each part over the successes with a timeline (None: none had one)."""
    pairs = [(t, ttft_s(r)) for r in ok if (t := timeline(r)) is not None]
    if not pairs:
        return None

    def mean(values: Iterable[float]) -> float:
        return round(statistics.fmean(values), 6)

    return TtftParts(requests=len(pairs), without=len(ok) - len(pairs),
                     prefill=mean(t.prefill_s for t, _ in pairs),
                     handover=mean(t.handover_s for t, _ in pairs),
                     decode=mean(t.decode_s + t.to_token_s for t, _ in pairs),
                     proxy=mean(t.proxy_s for t, _ in pairs),
                     wire=mean(t.wire_s for t, _ in pairs), ttft_mean=mean(v for _, v in pairs))


def tpot_s(r: RequestRecord) -> float | None:
    """Time per output token after the first as the client saw it (vllm bench's); None for a
    one-token answer."""
    tokens = r.output_tokens
    if tokens < 2 or len(r.token_ns) < 2:
        return None
    return (r.token_ns[-1] - r.token_ns[0]) / NS / (tokens - 1)


def burst_read(r: RequestRecord) -> bool:
    """Whether the answer's tokens after the first all reached the client faster than any
    engine decodes one stream: read together from the socket's buffer (a client that fell
    behind on a busy machine, or an engine that sent its answer at once), so their spacing
    says nothing of decoding."""
    seen = tpot_s(r)
    return seen is not None and seen < BURST_S_PER_TOKEN


def itl_s(r: RequestRecord) -> list[float]:
    return [(b - a) / NS for a, b in pairwise(r.token_ns)]


def e2e_s(r: RequestRecord) -> float:
    return (r.end_ns - r.sent_ns) / NS


def lag_s(r: RequestRecord) -> float | None:
    return (r.sent_ns - r.scheduled_ns) / NS if r.sent_ns else None


@dataclass(frozen=True)
class Slo:
    """Bounds a request must meet to count towards goodput (None = no bound)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """The per-request bounds of an `--slo` (`loadgen/slo.py`'s grammar)."""
        found = cls.of(slo.parse(text))
        if found is None:
            raise InputError(f"--slo {text!r}: give a bound on each request, e.g. "
                             "ttft<=500ms,tpot<=50ms")
        return found

    @classmethod
    def of(cls, objectives: slo.Objectives) -> Slo | None:
        """The per-request bounds of parsed objectives (None: there are none)."""
        bounds = {f"{t.metric}_ms": round(t.limit_s * 1000, 6) for t in objectives.per_request}
        return cls(**bounds) if bounds else None

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms),
                                  ("e2e_ms", self.e2e_ms)) if v is not None}

    def met(self, r: RequestRecord) -> bool:
        if self.ttft_ms is not None and ttft_s(r) * 1000 > self.ttft_ms:
            return False
        tpot = tpot_s(r)
        if self.tpot_ms is not None and tpot is not None and tpot * 1000 > self.tpot_ms:
            return False
        return not (self.e2e_ms is not None and e2e_s(r) * 1000 > self.e2e_ms)


def _flat(groups: Iterable[list[float]]) -> list[float]:
    return [v for group in groups for v in group]


def _tokens_source(ok: list[RequestRecord]) -> str | None:
    with_usage = sum(1 for r in ok if r.completion_tokens is not None)
    if not ok:
        return None
    return "usage" if with_usage == len(ok) else "chunks" if with_usage == 0 else "mixed"


def level_stats(result: LevelResult, slo: Slo | None = None) -> LevelFigures:
    """A level's statistics: timings over successes only; failures and cancellations counted."""
    records = result.records
    ok = [r for r in records if r.ok]
    failed = [r for r in records if r.failed]
    duration = max((result.end_ns - result.start_ns) / NS, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    lags = [x for x in (lag_s(r) for r in records) if x is not None]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    figures = LevelFigures(
        ok=len(ok), failed=len(failed), cancelled=sum(r.cancelled for r in records),
        unsent=result.unsent, errors=dict(Counter(str(r.error) for r in failed)),
        duration_s=round(duration, 4), output_tokens=out_tokens,
        output_tokens_per_s=round(out_tokens / duration, 3),
        requests_per_s=round(len(ok) / duration, 4), tokens_from=_tokens_source(ok),
        schedule_lag_s=summary(lags),
        ttft_s=summary([ttft_s(r) for r in ok]),
        ttft_answer_s=summary([x for x in (ttft_answer_s(r) for r in ok) if x is not None]),
        reasoning_requests=sum(1 for r in ok if r.reasoning_ns),
        blank_outputs=sum(1 for r in ok if r.blank_output),
        burst_reads=sum(1 for r in ok if burst_read(r)) or None,
        ttft_parts=ttft_parts(ok),
        tpot_s=summary([x for x in (tpot_s(r) for r in ok) if x is not None]),
        itl_s=summary(_flat(itl_s(r) for r in ok)), e2e_s=summary([e2e_s(r) for r in ok]),
        prompt_tokens_mean=round(sum(prompts) / len(prompts), 1) if prompts else None,
        cached_tokens_per_response=_cached(ok))
    if slo is not None:
        good = sum(1 for r in ok if slo.met(r))
        figures.goodput = Goodput(slo=slo.as_dict(), requests=good,
                                  requests_per_s=round(good / duration, 4),
                                  fraction=round(good / len(records), 4) if records else None)
    return figures


def _cached(ok: list[RequestRecord]) -> CachedTokens | None:
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    if not cached:
        return None
    return CachedTokens(responses=len(cached), total=sum(cached),
                        mean=round(sum(cached) / len(cached), 1))


def failures(records: Sequence[RequestRecord], limit: int = 5) -> list[Failure]:
    """The first few failures as data: index, kind, status and a short detail."""
    return [Failure(index=r.index, error=r.error, status=r.status, detail=r.error_detail[:200])
            for r in records if r.failed][:limit]
