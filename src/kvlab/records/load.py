"""Load-generator lines: a level's row (`load`), the link counters around a run (`link`) and
the most load that met a target (`capacity`), with every part of their evidence declared.

The fields compare-disagg.py reads (label, concurrency, requests, model, prompt_set,
max_tokens, `ttft_s`/`tpot_s` percentiles, output_tokens_per_s; a link line's rx/tx bytes)
keep the seed's names and places; what kvlab adds is grouped in the parts below.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, JsonValue

from kvlab.records.base import Deltas, Number, Record, Strict
from kvlab.records.evidence import (
    CachedTokens,
    EngineLine,
    Failure,
    KvType,
    LlamaServerLine,
    Percentiles,
    PerUrl,
    SideChannel,
    Where,
)


class ThinkTimeLine(Strict):
    """How long a user thinks between a reply and the next turn."""

    kind: Literal["fixed", "exponential", "trace", "paced"]
    mean_s: float
    source: str | None = Field(None, description="Where the mean came from (a paced think "
                               "time's request time, a trace file).")
    in_flight: int | None = Field(None, description="paced: users meant to wait at once.")
    values: int | None = Field(None, description="trace: how many think times it draws from.")


class Workload(Strict):
    """The kind of workload a row measured and its level."""

    kind: Literal["prompt set", "sessions", "trace"]
    concurrency: int | None = Field(None, description="A prompt set's concurrent requests.")
    users: int | None = Field(None, description="Sessions: users live at once.")
    turns: int | None = None
    think_time: ThinkTimeLine | None = None
    user_rate: float | None = Field(None, description="New users a second (None: all there "
                                    "from the start).")
    arrivals: str | None = None
    in_flight_cap: int | None = Field(None, description="A trace's in-flight cap.")


class SessionsEvidence(Strict):
    """What user sessions' turns showed: returning turns, how many came back after eviction,
    cached tokens on first and returning turns, the working set."""

    conversations: int
    turns: int
    returning_turns: int
    evicted_turns: int
    held_turns: int
    returning_hit_rate: float | None = None
    returning_cached_tokens_mean: float | None = None
    first_turn_cached_tokens_mean: float | None = None
    working_set_tokens: int
    cache_block_tokens: int
    cache_block_from: str
    eviction_rule: str
    conversations_planned: int | None = None
    conversations_started: int | None = None
    peak_active_users: int | None = None


class TraceEvidence(Strict):
    """A replayed trace: which, how it was sized and sped up, what an infinite cache would
    reuse of it."""

    path: str
    sha256: str
    format: str
    requests: int
    limit: int | None = Field(None, description="--trace-limit: the trace's first N requests, "
                              "counted before any was left out.")
    max_input: int | None = Field(None, description="--trace-max-input, tokens.")
    over_max_input: Literal["truncate", "filter"] | None = Field(
        None, description="What became of a longer request: cut to fit (truncate) or left out "
        "(filter).")
    left_out_over_max_input: int = 0
    truncated_to_max_input: int = 0
    block_tokens: int
    speedup: float
    span_s: float
    distinct_blocks: int
    reusable_fraction_infinite_cache: float | None = None
    outputs_capped: int = 0
    tokens_from: str | None = None


class DatasetEvidence(Strict):
    """A dataset file the user brought: which (its name and digest, never its contents), how
    it was read, and what of it a level sent."""

    file: str = Field(description="The file's name (not its folder).")
    sha256: str
    format: Literal["sharegpt", "prompts"]
    records: int = Field(description="Records in the file.")
    usable: int = Field(description="Records that can be sent (the rest were skipped).")
    skipped: dict[str, int] = Field(default_factory=dict, description="Records left out, by "
                                    "reason.")
    keys: list[str] = Field(default_factory=list, description="The keys read: the prompt's "
                            "and the output length's (JSONL), conversations (ShareGPT).")
    conversations: int = Field(0, description="Usable records with more than one user turn "
                               "(replayed as user sessions).")
    sent: int = Field(0, description="Records this level sent (or began).")
    first_record: int = Field(0, description="The usable record this level began with "
                              "(0-based; levels and repeats go on through the file).")
    resent: int = Field(0, description="Of those, records an earlier level or repeat of the "
                        "run had sent (the file ran out and began again; their prefixes may "
                        "still be cached).")
    outputs_from_file: int = Field(0, description="Requests whose max_tokens was the "
                                   "record's own output length.")
    outputs_capped: int = Field(0, description="Of those, capped at the run's max_tokens.")


class CapacityProbe(Strict):
    """A capacity search's probe: the knob, its load, the step."""

    knob: str
    load: float
    step: int


class PressurePlanned(Strict):
    """The pressure a run was sized for (`experiments/pressure.py`)."""

    concurrency: int
    requests: int
    conversations: int
    conversation_tokens: int
    working_set_tokens: int
    cache_tokens: int
    kv_cache_bytes: int
    bytes_per_token: float
    reusable_fraction: float
    preamble_tokens: int | None = None
    users: int | None = None
    turns: int | None = None
    first_turn_tokens: int | None = Field(None, description="The first turn's prompt (the "
                                          "system line, the opening, the question), chat "
                                          "template included, as planned.")
    tokens_from: str | None = Field(None, description="How the plan counted tokens: the "
                                    "model directory's tokenizer and chat template, or the "
                                    "word estimate.")
    oversubscription: float
    tier_tokens_needed: int | None = None
    tier_bytes_needed: int | None = None
    host_tier_bytes: int | None = Field(None, description="The host tier the run started.")


class HostTierUse(Strict):
    """What a host tier held and moved during a run, as the engine itself logged it."""

    source: str = Field(description="Where the figures were read.")
    limit_bytes: int | None = None
    peak_bytes: int | None = None
    peak_entries: int | None = Field(None, description="Most prompts held at once.")
    stores: int = Field(0, description="Prompts a slot gave up to the tier for another "
                        "conversation.")
    loads: int = Field(0, description="Prompts brought back from the tier into a slot.")


class PressureReached(Strict):
    """The pressure a run reached, from the engine's own gauges and counters."""

    peak_kv_cache_usage: float | None = None
    peak_requests_waiting: float | None = None
    preemptions: float | None = None
    prefix_hit_rate: float | None = None
    evicted_turns: int | None = None
    host_tier: HostTierUse | None = None


class Pressure(Strict):
    """A tier measurement's pressure, stated: quiet, under pressure, or a capacity search."""

    state: Literal["quiet", "under pressure", "capacity search"]
    planned: PressurePlanned | None = None
    reached: PressureReached | None = None


class PromptSizing(Strict):
    """How a row's prompts were sized: the model's own tokenizer or the estimate."""

    method: Literal["tokenizer", "estimate"]
    source: str
    tokens_per_word: float
    preamble_tokens_requested: int
    preamble_tokens_actual: int | None = None


class PrefixGroups(Strict):
    """A shared-prefix set split into groups, and each group's share of the requests."""

    groups: int
    shares: list[float]


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
    tier_blocks: int = 0
    in_flight: int = Field(1, description="Requests the model keeps in flight (their blocks "
                           "cannot be evicted), as measured.")
    sizes_from: str = Field(description="Where the block size and capacities came from.")
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
    vllm_metrics: dict[str, float] | None = Field(
        None, description="The metrics --percentile-metrics chose at --metric-percentiles, "
        "in ms, named and defined as vllm bench serve's (mean_ttft_ms, p99_ttft_ms, ...).")
    result_file: str | None = Field(None, description="--save-result: the level's document "
                                    "in vllm bench serve's format.")


class RequestShape(Strict):
    """What every request of a row carried beyond its prompt (vllm bench serve's options)."""

    temperature: float | None = None
    extra_body: dict[str, JsonValue] | None = Field(None, description="--extra-body, merged "
                                                     "into every request's body.")
    request_headers: dict[str, str] | None = Field(
        None, description="--header, sent on every request, but for those that look like a "
        "secret.")
    request_headers_withheld: int | None = Field(
        None, description="Headers sent whose name or value looks like a secret: left out.")
    metadata: dict[str, str] | None = Field(None, description="--metadata KEY=VALUE.")
    burstiness: float | None = Field(None, description="Open loop: the gamma shape of the "
                                     "arrival gaps (1: Poisson; inf is written as even).")
    random_input_len: int | None = Field(
        None, description="--random-input-len: the token ids drawn for every random prompt "
        "(sent as ids, the server counts exactly these; sent as text, the input token figures "
        "are the server's count of the text, which may differ by a few).")
    prompt_form: Literal["ids", "text"] | None = Field(
        None, description="--prompt-form: how the random prompts were sent: ids (their token "
        "ids, no tokenization in TTFT) or text (the server's /detokenize of those ids, made "
        "before the run, as vllm bench sends text: the server's tokenization is inside TTFT).")


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


class RdmaPortDelta(Strict):
    """One RDMA port's bytes over a run."""

    rx_bytes: int
    tx_bytes: int
    units: str
    saturated: bool = Field(description="A 32-bit counter that may have wrapped.")


class RdmaCounters(Strict):
    """RDMA port counters over a run: each port that moved, and their sum."""

    ports: dict[str, RdmaPortDelta] = Field(default_factory=dict)
    rx_bytes: int = 0
    tx_bytes: int = 0
    saturated: bool = False


class NixlCounters(Strict):
    """NIXL's own counters on one engine over a run."""

    nixl_bytes: float | None = None
    nixl_transfers: float | None = None
    nixl_transfer_s: float | None = None
    nixl_failed_transfers: float | None = None


class LegFigures(Strict):
    """One engine of a split over a load run (XpYd: each of them), by its own /metrics and
    against the prediction."""

    role: str = Field(description="prefill, prefill-2, ..., decode, decode-2, ...")
    metrics_url: str
    node: str | None = Field(None, description="Its Ray node (None: where kvlab runs).")
    requests: float | None = Field(None, description="Requests it finished "
                                   "(vllm:request_success delta).")
    prompt_tokens: float | None = None
    computed_tokens: float | None = Field(None, description="Prompt tokens it computed itself.")
    loaded_tokens: float | None = Field(None, description="Prompt tokens it loaded through "
                                        "the connector.")
    predicted_bytes: float | None = Field(None, description="Its requests times the "
                                          "prediction's KV payload per request.")
    observed_bytes: float | None = Field(None, description="KV it moved by its own counters: "
                                         "NIXL's bytes, else its loaded tokens times the "
                                         "prediction's bytes per token.")
    observed_from: str | None = Field(None, description="nixl or loaded_tokens.")


class LinkRecord(Record, Where):
    """run-load.sh's interface counters around one load run."""

    kind: ClassVar[str] = "link"
    record: Literal["link"] = "link"
    base_url: str | None = None
    context_length: int | None = None
    prompt_set: str | None = None
    concurrency: str | int | None = None
    requests: int | None = None
    iface: str | None = None
    wall_s: float | None = None
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rdma: RdmaCounters | None = None
    store_bytes: int | None = None
    legs: dict[str, str] | None = Field(None, description="The proxy's upstreams by role.")
    metric_deltas: PerUrl = Field(default_factory=dict,
                                  description="Each engine's evidence deltas, by URL.")
    nixl: dict[str, NixlCounters] | None = Field(None, description="NIXL's own counters, "
                                                 "by URL.")
    side_channel: SideChannel | None = None
    model: str | None = None
    max_tokens: int | None = None
    load_generator: str | None = None
    repeat: int | None = None
    requests_sent: int | None = None
    requests_ok: int | None = None
    requests_failed: int | None = None
    interrupted: bool | None = None
    engines: list[EngineLine] | None = Field(None, description="The engines the run measured, "
                                             "as on its load rows.")
    per_leg: list[LegFigures] | None = Field(None, description="A split's engines, one entry "
                                             "each: requests and KV bytes per leg.")


class BoundFigure(Strict):
    """One bound's figure at a probe: the percentile, its 95% interval, the bound."""

    value: float | None = None
    low: float | None = None
    high: float | None = None
    n: int | None = None
    bound: float


class CapacityStep(Strict):
    """One probe of a capacity search."""

    load: float
    met: bool
    why: str
    ok: int
    failed_share: float
    figures: dict[str, BoundFigure] = Field(default_factory=dict)
    repeats: int
    rows: list[str] = Field(default_factory=list, description="Its per-request files.")


class CapacityTarget(Strict):
    """A latency target: as written, each bound in seconds, the failures allowed."""

    slo: str
    bounds: dict[str, float]
    errors: float


class CapacityMethod(Strict):
    """How a capacity search probed."""

    start: float
    factor: float
    resolution: float
    max_steps: int
    min_requests: int | None = None
    duration_s: float | None = None
    repeats: int
    interval: str
    due: str | None = None


class CapacityRecord(Record, RunContext):
    """The highest load that met a latency target (`kvlab load --find-capacity`)."""

    kind: ClassVar[str] = "capacity"
    record: Literal["capacity"] = "capacity"
    knob: Literal["rate", "concurrency", "users", "speedup"] = Field(
        description="What was raised: requests/s (open loop), concurrent requests, users "
        "(sessions), or a trace's replay speed.")
    unit: str
    target: CapacityTarget
    capacity: Number | None = Field(None, description="The highest load that met the target "
                                    "below the lowest that missed it (None: none met it).")
    met_below: Number | None = None
    missed_at: Number | None = Field(None, description="The lowest load that missed it.")
    verdict: Literal["found", "not-converged", "at-least", "none-met"]
    statement: str
    steps: list[CapacityStep] = Field(default_factory=list)
    method: CapacityMethod
    model: str | None = None
    base_url: str | None = None
    prompt_set: str | None = None
    max_tokens: int | None = None
    workload: Workload | None = None
    not_monotonic: list[float] | None = Field(None, description="Loads that met the target "
                                              "above one that missed it.")
