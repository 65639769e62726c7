"""The `load` line: one load-generator level (the seed's load-test.py row, as compare-disagg.py
reads it), with every part of its evidence declared: what the caller of the run knows beside
the load generator (where, on what, under what tier and pressure, which probe of a capacity
search), the level's statistics, and what the level adds of its own (its warm-up, its
per-request file, the cache oracle beside it).

The fields compare-disagg.py reads (label, concurrency, requests, model, prompt_set,
max_tokens, `ttft_s`/`tpot_s` percentiles, output_tokens_per_s) keep the seed's names and
places; what kvlab adds is grouped in the parts below. What the level sent (its workload, how
its prompts were built) is `workload.py`'s and the pressure it was sized for and reached is
`pressure.py`'s; the link counters around a run (`link.py`) and a capacity search's answer
(`capacity.py`) are lines of their own.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Deltas, Record, Strict
from kvlab.records.evidence import (
    CachedTokens,
    EngineLine,
    Failure,
    KvType,
    LlamaServerLine,
    Percentiles,
    Where,
)
from kvlab.records.pressure import Pressure
from kvlab.records.replicas import ReplicaCounts
from kvlab.records.workload import (
    DatasetEvidence,
    PrefixGroups,
    PromptSizing,
    RequestShape,
    SessionsEvidence,
    TraceEvidence,
    Workload,
)


class CapacityProbe(Strict):
    """A capacity search's probe: the knob, its load, the step."""

    knob: str
    load: float
    step: int


class Goodput(Strict):
    """Successes that met every SLO bound."""

    slo: dict[str, float]
    requests: int
    requests_per_s: float
    fraction: float | None = None


class KvSamples(Strict):
    """The engine's KV gauges sampled through a run (seconds from its start)."""

    t_s: list[float] = Field(default_factory=list)
    kv_cache_usage_perc: list[float | None] | None = None
    requests_running: list[float | None] | None = None
    requests_waiting: list[float | None] | None = None
    offload_store_bytes: list[float | None] | None = Field(None, description="The host "
                                                           "tier's bytes written, cumulative.")
    offload_load_bytes: list[float | None] | None = Field(None, description="The host tier's "
                                                          "bytes read back, cumulative.")


class RunContext(Where, KvType):
    """What the caller of a load run knows beside the load generator: where it ran, on what,
    under what tier and pressure (set on every row of the run)."""

    tier: str | None = Field(None, description="The host tier: none, or its size and backend.")
    memory_fraction: float | None = Field(None, description="vLLM's --gpu-memory-utilization "
                                          "as the run set it.")
    context_length: int | None = None
    pressure: Pressure | None = None
    capacity_probe: CapacityProbe | None = None
    legs: dict[str, str] | None = Field(None, description="The proxy's upstreams by role.")
    engine_version: str | None = None
    server: LlamaServerLine | None = Field(None, description="llama-server as started.")
    llama_parallel: int | None = Field(None, description="llama-server's slots, the variable "
                                       "of the interference run.")
    varied: str | None = Field(None, description="The one setting the run varied.")
    engines: list[EngineLine] | None = Field(None, description="The engines the row measured, "
                                             "each as it stated itself (its startup line, "
                                             "its effective arguments).")


class TtftParts(Strict):
    """A split's TTFT taken apart (means over the successes that carry kvlab's proxy's
    timeline, seconds; `records.requests.ProxyTimeline` defines each part): the parts' means
    add up to `ttft_mean`, the same requests' mean TTFT."""

    requests: int = Field(description="Successes with a timeline.")
    without: int = Field(0, description="Successes without one.")
    prefill: float
    handover: float
    decode: float = Field(description="To decode's first token: the proxy's decode part and "
                          "the client's wait from the answer's first event to its first token.")
    proxy: float
    wire: float = Field(description="Between the client and the proxy.")
    ttft_mean: float


class TtftAccount(Strict):
    """Where a level's TTFT went, by the engine's own accounts (means over the measured
    requests, seconds): waiting to be scheduled, computing the prompt, and what the client
    saw beyond the engine's own time to first token (its front end, HTTP, the stream). A part
    the engine does not report is None, and `not_reported` says so."""

    source: str = Field(description="Where the engine's figures came from.")
    requests: int = Field(description="Requests the engine's figures are over (its "
                          "histograms may trail the level's last responses at the scrape).")
    client_ttft: float = Field(description="The client's mean TTFT over the level's successes.")
    queue: float | None = None
    prefill: float | None = None
    engine_ttft: float | None = Field(None, description="The engine's own mean time to first "
                                      "token, arrival to first token.")
    outside: float | None = Field(None, description="client_ttft - engine_ttft (or - queue - "
                                  "prefill where the engine reports no TTFT of its own).")
    not_reported: str | None = None


class LevelFigures(Strict):
    """A level's statistics (`loadgen/stats.py` defines each): timings over successes only,
    failures and cancellations counted apart."""

    ok: int | None = None
    failed: int | None = None
    cancelled: int | None = None
    unsent: int | None = None
    errors: dict[str, int] = Field(default_factory=dict, description="Failures by kind.")
    duration_s: float | None = None
    output_tokens: int | None = None
    output_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    tokens_from: str | None = Field(None, description="Output tokens from the server's usage, "
                                    "counted chunks, or mixed.")
    schedule_lag_s: Percentiles | None = None
    ttft_s: Percentiles | None = None  # absent when no request of the level succeeded
    ttft_answer_s: Percentiles | None = Field(None, description="To the first answer token, "
                                              "over the successes that gave one.")
    reasoning_requests: int | None = Field(None, description="Successes that reasoned first "
                                           "(their TTFT is a reasoning token's).")
    blank_outputs: int | None = Field(None, description="Successes whose stream carried "
                                      "choices and usage output tokens but no visible text "
                                      "(random weights can decode to nothing): timed from the "
                                      "first choice-carrying event, as vllm bench does.")
    ttft_parts: TtftParts | None = Field(None, description="Through kvlab's proxy: TTFT "
                                         "split into prefill, hand-over, decode, proxy.")
    ttft_account: TtftAccount | None = Field(None, description="Where TTFT went by the "
                                             "engine's own accounts.")
    burst_reads: int | None = Field(None, description="Successes whose tokens all reached the "
                                    "client faster than any engine decodes one stream "
                                    "(loadgen/stats.BURST_S_PER_TOKEN): read together (a client "
                                    "that fell behind, or an engine that sent its answer at "
                                    "once); in tpot_s as the client saw them, left out of "
                                    "comparisons' TPOT intervals.")
    tpot_s: Percentiles | None = None
    itl_s: Percentiles | None = None
    e2e_s: Percentiles | None = None
    prompt_tokens_mean: float | None = None
    cached_tokens_per_response: CachedTokens | None = None
    goodput: Goodput | None = None


class TierPoint(Strict):
    """The oracle's hit share over a level's measured requests (the warm-up replayed before
    them) had the engine had a host tier of `tier_blocks` blocks: no engine ran it."""

    tier_blocks: int
    hit_share: float | None = None
    returning_hit_share: float | None = Field(None, description="The same over the returning "
                                              "turns of user sessions alone (turn 2 on).")


class OracleLevel(Strict):
    """The cache oracle beside a level (`measure/oracle.py`): the level's requests, warm-up
    included, replayed in the order they were sent through a model of the engine's prefix
    cache sized as the engine reported it, against the cached tokens the engine reported."""

    cache_model: str = Field(description="The model replayed and where it departs from the "
                             "engine.")
    block_tokens: int
    device_blocks: int
    slots: int | None = Field(None, description="llama.cpp: the server's slots, each holding "
                              "one prompt's tokens (block_tokens 1, device_blocks 0).")
    ram_cache_bytes: int | None = Field(None, description="llama.cpp: the in-RAM prompt cache "
                                        "replayed under the slots, its byte limit (0: none).")
    ram_cache_note: str | None = Field(None, description="llama.cpp: why no RAM cache was "
                                       "replayed (off, or not known from the server).")
    tier_blocks: int = 0
    in_flight: int = Field(1, description="Requests the model keeps in flight (their blocks "
                           "cannot be evicted), as measured.")
    sizes_from: str = Field(description="Where the block size and capacities came from.")
    earlier_requests: int | None = Field(None, description="Requests the sweep sent before "
                                         "the level, replayed first (not counted): the cache "
                                         "the level started from.")
    tokens_from: str = Field(description="How each request's exact tokens were known.")
    requests: int = Field(description="Measured requests compared (ok, not warm-up).")
    prompt_tokens: int
    predicted_cached_tokens: int
    measured_cached_tokens: int
    infinite_cache_tokens: int = Field(description="What a cache that never evicts serves.")
    above_oracle: int = Field(description="Requests the engine served more of than predicted.")
    left_share: float | None = Field(None, description="Reuse left on the table: (predicted "
                                     "- measured) / prompt tokens.")
    left_mean_low: float | None = Field(None, description="95% interval of the per-request "
                                        "mean share left on the table.")
    left_mean_high: float | None = None
    tier_curve: list[TierPoint] = Field(default_factory=list, description="The same requests "
                                        "replayed with host tiers of several sizes.")

    @property
    def predicted_share(self) -> float | None:
        return self.predicted_cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def measured_share(self) -> float | None:
        return self.measured_cached_tokens / self.prompt_tokens if self.prompt_tokens else None


class LevelOwn(Strict):
    """What a level adds of its own: its workload's evidence, its warm-up, how its prompts were
    sized, its per-request file, the cache oracle beside it."""

    prompt_set: str | None = None
    arrivals: str | None = None
    workload: Workload | None = None
    sessions: SessionsEvidence | None = None
    trace: TraceEvidence | None = None
    dataset: DatasetEvidence | None = None
    warmup_requests: int | None = Field(None, description="Requests sent first and left out "
                                        "of every statistic.")
    warmup_failed: int | None = None
    warmup_cancelled: int | None = None
    prompt_sizing: PromptSizing | None = None
    requests_file: str | None = Field(None, description="The level's per-request file, "
                                      "relative to the notebook's folder.")
    requests_sha256: str | None = Field(None, description="That file's sha256.")
    oracle: OracleLevel | None = None
    oracle_absent: str | None = Field(None, description="Why the level has no cache oracle "
                                      "(a prompt the engine would not tokenize, a cache it "
                                      "does not state).")
    vllm_metrics: dict[str, float] | None = Field(
        None, description="The metrics --percentile-metrics chose at --metric-percentiles, "
        "in ms, named and defined as vllm bench serve's (mean_ttft_ms, p99_ttft_ms, ...).")
    result_file: str | None = Field(None, description="--save-result: the level's document "
                                    "in vllm bench serve's format.")
    client_processes: int | None = Field(None, description="Processes that sent the open-loop "
                                         "level on its one schedule (each its own event loop; "
                                         "unset: one).")
    client_cpu_per_request_s: float | None = Field(
        None, description="The client's own CPU time per request on the level's warm-up, "
        "from which the processes were chosen.")


class LoadRecord(Record, RunContext, LevelFigures, LevelOwn, RequestShape):
    """One load-generator level (the seed's load-test.py row, as compare-disagg.py reads it)."""

    kind: ClassVar[str] = "load"
    record: Literal["load"] = "load"
    concurrency: int
    requests: int
    requests_planned: int | None = None
    model: str | None = None
    max_tokens: int | None = None
    failures: list[Failure] = Field(default_factory=list, description="The first few.")
    duration_s_requested: float | None = None
    duration_reached: bool | None = None
    requests_built_during_level: int | None = None
    max_seconds: float | None = Field(None, description="--max-seconds: nothing was sent after "
                                      "this long.")
    cut_at_max_seconds: bool | None = Field(None, description="Whether the level reached it "
                                            "before sending every request (the rest unsent).")
    interrupted: bool | None = Field(None, description="Stopped before the level ended.")
    engine: str | None = None
    base_url: str | None = None
    endpoint: str | None = None
    rate: float | None = None
    timeout_s: float | None = None
    ignore_eos: bool | None = None
    workload_seed: int | None = None
    preamble_tokens: int | None = None
    prefix_groups: PrefixGroups | None = None
    connections_opened: int | None = None
    metric_deltas: Deltas = Field(default_factory=dict, description="The engine's evidence "
                                  "counters over the level, by name.")
    prefix_hit_rate: float | None = None
    metrics_url: str | None = None
    replicas: list[ReplicaCounts] | None = Field(None, description="Several --metrics-url: "
                                                 "each engine's counters over the level "
                                                 "(metric_deltas is their sum).")
    replica_note: str | None = Field(None, description="A replica whose prefix cache found far "
                                     "less than the others', named.")
    min_requests: int | None = None
    repeat: int | None = Field(None, description="Which repeat of the run (0-based).")
    repeat_rule: str | None = Field(None, description="How a sequential run (--repeat auto) "
                                    "decided how many repeats to run (`experiments/repeats."
                                    "Sequential.rule`), on every row of its two sides.")
    repeat_confidence: float | None = Field(None, description="The level the rule reads the "
                                            "run's intervals at (e.g. 0.9875), on every row "
                                            "of its two sides: reports read them at it too.")
    repeat_stop: str | None = Field(None, description="Why the sequential run stopped, on the "
                                    "row whose writing completed the round it stopped after "
                                    "(the rows are written as they are measured, so the rows "
                                    "before it were written without it).")
    kv_usage_samples: KvSamples | None = None
