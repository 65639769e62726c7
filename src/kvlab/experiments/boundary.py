"""`kvlab run disagg --part boundary`: where the split starts or stops paying, by prompt length.

The P/D lab: "If long prompts improve while short prompts regress, report both and use that
boundary in the routing decision." The same prompts go through the split (kvlab's proxy in
front of the prefill/decode pair) and through the monolithic baseline, one length at a time,
at each concurrency asked for; every request is a cold prompt of its own (a distinct opening,
so neither a prefix cache nor the connector's store can serve it from an earlier request),
which is the work a split moves. Lengths are whole prompts: the first (warm-up) request shows
what the chat template adds. Each length and side gives one `boundary-point` line (TTFT
percentiles from the load generator's own client, the server's prompt token counts, the
engine's counter deltas); each concurrency gives one `boundary` line with the judgement.

The judgement is `measure.crossing.judge_crossing`'s: where the split/baseline ratio of TTFT
p50 crosses 1.0 along the lengths.
Deliberately not here: starting engines (the disagg experiment's sessions do that).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import httpx

from kvlab.core import EngineError, JsonObject, SettingError, api_base
from kvlab.engines import evidence_deltas
from kvlab.experiments.lab import Lab
from kvlab.loadgen import (
    Endpoint,
    LevelResult,
    LevelRun,
    Schedule,
    decode_events,
    stats,
    workloads,
)
from kvlab.measure import Point, judge_crossing
from kvlab.observe import metrics
from kvlab.records import (
    BOUNDARY,
    BOUNDARY_BASELINE,
    BOUNDARY_SPLIT,
    LAB_PD,
    BoundaryCell,
    BoundaryPointRecord,
    BoundaryRecord,
    Failure,
    Where,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

Side = Literal["split", "baseline"]
DEFAULT_LENGTHS = (128, 512, 1024, 2048, 3072)  # on the CPU defaults' CTX 4096
TEMPLATE_TOKENS = 16  # what a chat template adds around one user message, at most


def _csv(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


@dataclass(frozen=True)
class BoundarySpec:
    """The sweep: prompt lengths (model tokens), concurrency levels, requests per point."""

    lengths: tuple[int, ...] | None = None  # None: DEFAULT_LENGTHS, those that fit CTX
    levels: tuple[int, ...] = (1,)
    requests: int = 3
    max_tokens: int = 16  # TTFT is the point; a short answer keeps the sweep quick

    def resolved(self, ctx: int) -> BoundarySpec:
        """The spec with its lengths for this context; refuses lengths given that cannot
        make a boundary or do not fit."""
        if self.lengths is not None:
            self.check(ctx)
            return self
        fit = tuple(n for n in DEFAULT_LENGTHS if n + self.max_tokens <= ctx)
        spec = replace(self, lengths=fit)
        spec.check(ctx)
        return spec

    @property
    def sweep(self) -> tuple[int, ...]:
        """The lengths to sweep, once `resolved`."""
        if self.lengths is None:
            raise ValueError("BoundarySpec.resolved(ctx) gives the lengths")
        return self.lengths

    def check(self, ctx: int) -> None:
        """Refuse lengths that cannot make a boundary or do not fit the context."""
        if self.lengths is None:
            raise SettingError("--lengths: no prompt lengths to sweep")
        if len(set(self.lengths)) < 2 or min(self.lengths) < TEMPLATE_TOKENS * 2:
            raise SettingError(f"--lengths {_csv(self.lengths)}: give two or more distinct "
                               f"prompt lengths of at least {TEMPLATE_TOKENS * 2} tokens")
        if not self.levels or min(self.levels) < 1 or self.requests < 1:
            raise SettingError("--boundary-concurrency and --boundary-requests must be >= 1")
        longest = max(self.lengths) + self.max_tokens
        if longest > ctx:
            raise SettingError(f"--lengths {_csv(self.lengths)}: {max(self.lengths)} prompt "
                               f"tokens + {self.max_tokens} answer tokens exceed CTX {ctx}; "
                               "choose shorter lengths or raise CTX")


@dataclass(frozen=True)
class SideTarget:
    """One side's URLs: where the requests go and whose /metrics holds the evidence."""

    side: Side
    base_url: str
    metrics_url: str
    where: Where  # topology fields, as the load rows record them


# --- prompts ------------------------------------------------------------------------------
def tokenizer_for(model: str) -> Tokenizer | None:
    """The model's own tokenizer when the model is a local directory."""
    path = Path(model) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def sized_text(tokenizer: Tokenizer | None, tokens: int, key: str) -> str:
    """About `tokens` tokens of text (exactly, with a tokenizer), opening with `key` so no
    other prompt of the run shares its first block."""
    rng = random.Random(f"boundary:{key}")
    head = f"Document {key}."
    if tokenizer is None:  # about 1.3 tokens a word; the server's usage says what it was
        return f"{head} {workloads.passage(rng, workloads.words_for(tokens))}"
    text = f"{head} {workloads.passage(rng, workloads.words_for(tokens * 2))}"
    return str(tokenizer.decode(tokenizer.encode(text).ids[:tokens]))


def messages(tokenizer: Tokenizer | None, tokens: int, key: str,
             template: int = TEMPLATE_TOKENS) -> list[dict[str, str]]:
    """One user message making a prompt of about `tokens` tokens with the chat template
    (which adds `template` tokens)."""
    return [{"role": "user", "content": sized_text(tokenizer, tokens - template, key)}]


def template_tokens(result: LevelResult, content_tokens: int) -> int:
    """What the chat template added, from the server's count for a known content length."""
    counted = result.records[0].prompt_tokens if result.records else None
    if counted is None or not 0 < counted - content_tokens <= TEMPLATE_TOKENS * 4:
        return TEMPLATE_TOKENS
    return counted - content_tokens


# --- measuring ----------------------------------------------------------------------------
async def measure(lab: Lab, spec: BoundarySpec, target: SideTarget,
                  model: str) -> list[BoundaryPointRecord]:
    """Every length at every level on one side; one `boundary-point` line each."""
    http = Endpoint.from_url(api_base(target.base_url))
    settings = lab.settings
    key = settings.api_key()
    tokenizer = tokenizer_for(model)

    template = TEMPLATE_TOKENS

    def body(tokens: int, name: str) -> JsonObject:
        return {"model": settings.served_name,
                "messages": messages(tokenizer, tokens, name, template),
                "max_tokens": spec.max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}

    # the first request of an engine pays one-off costs, so it is not a measurement; it shows
    # what the chat template adds, so that the lengths are the prompts' whole lengths
    shortest = min(spec.sweep)
    warm = await _level(http, [(0, http.request_bytes(
        "/chat/completions", body(shortest, f"warm-up-{target.side}"), key))], 1)
    if tokenizer is not None:
        template = template_tokens(warm, shortest - TEMPLATE_TOKENS)
    out = []
    lab.say(f"==> boundary, {target.side}: lengths {_csv(spec.sweep)} at concurrency "
            f"{_csv(spec.levels)}")
    async with httpx.AsyncClient(timeout=10.0, trust_env=False,
                                 headers={"Authorization": f"Bearer {key}"} if key else {}) as c:
        for level in spec.levels:
            for tokens in spec.sweep:
                count = max(spec.requests, level)
                payloads = [(i, http.request_bytes("/chat/completions",
                                                   body(tokens, f"{tokens}-c{level}-{i}"), key))
                            for i in range(count)]
                out.append(lab.record(await _point(c, http, payloads, level, tokens, spec,
                                                   target)))
    return out


async def _level(http: Endpoint, payloads: list[tuple[int, bytes]], level: int) -> LevelResult:
    result = await LevelRun(http, payloads, Schedule(concurrency=level), timeout_s=600.0).run()
    for record in result.records:
        decode_events(record)
    return result


async def _point(client: httpx.AsyncClient, http: Endpoint, payloads: list[tuple[int, bytes]],
                 level: int, tokens: int, spec: BoundarySpec,
                 target: SideTarget) -> BoundaryPointRecord:
    before = await metrics.scrape(client, target.metrics_url)
    result = await _level(http, payloads, level)
    after = await metrics.scrape(client, target.metrics_url)
    point = BoundaryPointRecord(
        label=(BOUNDARY_SPLIT if target.side == "split" else BOUNDARY_BASELINE).label,
        lab=LAB_PD, side=target.side, prompt_tokens_target=tokens, concurrency=level,
        requests=len(result.records), max_tokens=spec.max_tokens,
        metric_deltas=evidence_deltas(before, after), base_url=target.base_url,
        failures=stats.failures(result.records))
    return point.overlay(stats.level_stats(result)).overlay(target.where)


def require_points(rows: Sequence[BoundaryPointRecord]) -> None:
    """A point at which every request failed measured nothing: say so, as an error."""
    for row in rows:
        if not row.ok:
            first = row.failures[0] if row.failures else Failure(index=0)
            raise EngineError(f"boundary, {row.side}: all {row.requests} requests of "
                              f"{row.prompt_tokens_target} tokens failed at concurrency "
                              f"{row.concurrency}: {first.error} {first.detail[:160]}")


# --- the summary --------------------------------------------------------------------------
def _p50(row: BoundaryPointRecord | None) -> float | None:
    return row.ttft_s.p50 if row is not None and row.ttft_s is not None else None


def _from_store(row: BoundaryPointRecord | None) -> float | None:
    """Prompt tokens per request the split's decode loaded rather than computed (a connector
    moves whole KV blocks only: a prompt within one block is recomputed by decode)."""
    hits = row.metric_deltas.get("external_prefix_cache_hits") if row is not None else None
    if hits is None or row is None or not row.ok:
        return None
    return round(float(hits) / row.ok, 1)


def summarise(lab: Lab, spec: BoundarySpec,
              rows: Sequence[BoundaryPointRecord]) -> list[BoundaryRecord]:
    """One `boundary` line per concurrency level, from the points both sides measured."""
    out = []
    for level in spec.levels:
        by = {(r.side, r.prompt_tokens_target): r for r in rows if r.concurrency == level}
        points: list[Point] = []
        cells: list[BoundaryCell] = []
        for tokens in sorted(spec.sweep):
            split, base = by.get(("split", tokens)), by.get(("baseline", tokens))
            point = Point(tokens, _p50(split), _p50(base))
            points.append(point)
            cells.append(BoundaryCell(
                prompt_tokens_target=tokens, split_ttft_p50_s=point.split_s,
                baseline_ttft_p50_s=point.baseline_s,
                ratio=round(point.ratio, 4) if point.ratio is not None else None,
                split_prompt_tokens=split.prompt_tokens_mean if split else None,
                baseline_prompt_tokens=base.prompt_tokens_mean if base else None,
                split_tokens_from_store=_from_store(split)))
        found = judge_crossing(points)
        lab.say(f"==> boundary at concurrency {level}: {found.statement}")
        out.append(lab.record(BoundaryRecord(
            label=BOUNDARY.label, lab=LAB_PD, concurrency=level, verdict=found.verdict,
            statement=found.statement, crossing_tokens=found.crossing_tokens, points=cells,
            requests_per_point=max(spec.requests, level), max_tokens=spec.max_tokens)))
    return out
