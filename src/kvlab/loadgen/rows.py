"""A level's notebook row: the seed's load-test.py shape plus kvlab's figures and evidence.

`make_row` turns one level's records (`runner.LevelResult`) and the engine's counter deltas
into a `LoadRecord`: the fields compare-disagg.py reads (label, concurrency, requests, model,
prompt_set, max_tokens, `ttft_s`/`tpot_s`, `output_tokens_per_s`), then the statistics of
`stats`, the failures, the workload and where it ran. What a level adds of its own (its
per-request file, its sessions or trace) comes in `own`; what the caller knows (where the
engines ran, the tier, the pressure) in the spec's `context`, which has the last word.
"""

from __future__ import annotations

from typing import cast

from pydantic import JsonValue

from kvlab.core import is_secret_name, secret_in_text
from kvlab.loadgen import stats, topology, workloads
from kvlab.loadgen.runner import LevelResult
from kvlab.loadgen.spec import LoadSpec
from kvlab.observe import metrics
from kvlab.records import Deltas, LevelOwn, LoadRecord, RequestShape


def make_row(spec: LoadSpec, concurrency: int, result: LevelResult, deltas: Deltas,
             own: LevelOwn | None = None) -> LoadRecord:
    """One level's notebook row (seed shape + kvlab's additions; `own` from the level)."""
    sent = len(result.records)
    row = LoadRecord(
        label=spec.label, lab=spec.lab, run_id=spec.run_id, concurrency=concurrency,
        requests=sent, requests_planned=sent + result.unsent, model=spec.model,
        max_tokens=spec.max_tokens, engine=spec.engine, base_url=spec.base_url,
        endpoint=spec.endpoint, rate=spec.rate,
        arrivals=spec.arrivals if spec.rate else "closed-loop",
        timeout_s=spec.timeout_s, ignore_eos=spec.ignore_eos,
        prompt_set="random" if spec.random_input_len is not None else spec.prompt_set,
        workload_seed=spec.seed,
        preamble_tokens=None if spec.token_prompts else spec.preamble_tokens,
        prefix_groups=None if spec.token_prompts
        else workloads.prefix_groups(spec.prompt_set, spec.shares),
        workload=spec.workload(concurrency), failures=stats.failures(result.records),
        connections_opened=result.connections_opened, metric_deltas=deltas,
        prefix_hit_rate=_rounded(metrics.hit_rate(deltas)),
        metrics_url=(spec.metrics_url or metrics.metrics_url(spec.base_url))
        if spec.scrape_metrics else None,
        min_requests=spec.session_floor() if spec.sessions else None if spec.trace
        else spec.floor(concurrency), repeat=spec.repeat)
    row.overlay(request_shape(spec))
    row.overlay(stats.level_stats(result, spec.slo))
    row.ttft_account = stats.ttft_account([r for r in result.records if r.ok], deltas)
    row.overlay(topology.unknown(spec.base_url))  # a caller that knows more says so in context
    if own is not None:
        row.overlay(own)
    row.overlay(spec.context)
    if spec.duration_s is not None:
        row.duration_s_requested = spec.duration_s
        row.duration_reached = not result.exhausted
        row.requests_built_during_level = result.built_during
    if spec.max_s is not None:
        row.max_seconds, row.cut_at_max_seconds = spec.max_s, result.cut_at_max_s
    if result.interrupted:
        row.interrupted = True
    return row


def request_shape(spec: LoadSpec) -> RequestShape:
    """What every request carried beyond its prompt, as the row says it (a header that looks
    like a secret only counted; the rest was refused before the run if it held one)."""
    return RequestShape(
        temperature=spec.temperature,
        extra_body=cast("dict[str, JsonValue]", spec.extra_body) or None,
        request_headers={n: v for n, v in spec.headers if not _secret_header(n, v)} or None,
        request_headers_withheld=sum(_secret_header(n, v) for n, v in spec.headers) or None,
        metadata=dict(spec.bench.metadata) or None,
        burstiness=spec.burstiness if spec.rate and spec.burstiness != float("inf") else None,
        random_input_len=spec.random_input_len, input_stddev=spec.input_stddev or None,
        output_tokens_stddev=spec.output_stddev or None,
        prompt_form=(spec.prompt_form or "ids") if spec.random_input_len is not None else None)


def _secret_header(name: str, value: str) -> bool:
    return is_secret_name(name) or secret_in_text(value) is not None


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None
