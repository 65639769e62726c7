"""The other kinds kvlab writes: startup, reuse and proof, comparison, prediction, crossing,
not-run, disk, procedure and the prompt-length boundary, each with its parts declared.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Deltas, Number, Record, Strict
from kvlab.records.evidence import (
    EngineArgs,
    EngineLine,
    Failure,
    InstanceLine,
    KvCapacity,
    KvType,
    LlamaServerLine,
    NodeInfo,
    PerUrl,
    SideChannel,
    Where,
)
from kvlab.records.load import LevelFigures, Pressure

Verdict = Literal["reused", "silent-miss", "warm-up-only", "no-reuse-expected", "inconclusive"]
"""Did a request reuse KV, and if not, was that expected (`measure/verdict.py` decides)."""

# --- startup ---------------------------------------------------------------------------------


class EngineChoice(Strict):
    """Which build of an engine ran, from where, and why."""

    command: str
    origin: str = Field(description="VLLM_CMD, PATH or the kvlab venv.")
    platform: str
    reason: str


class HostTierCheck(Strict):
    """The host tier against available memory and swap, as checked before start (bytes)."""

    tier_bytes: int
    available_bytes: int
    swap_free_bytes: int
    engine_share_bytes: int
    fits: bool
    allowed_by: str | None = None


class SideChannelAddress(Strict):
    """NIXL's side-channel address and port as started, and what it resolves to."""

    addr: str | None = None
    port: int | None = None
    resolves_to: list[str] = Field(default_factory=list)
    iface: str | None = None
    cluster_iface: str | None = None
    note: str | None = Field(None, description="What is wrong with the address, if anything.")


class StartupFacts(Strict):
    """What kvlab chose while planning an instance: the build and why, the flags beyond the seed
    script's, the host figures it checked."""

    engine_choice: EngineChoice | None = None
    added_flags: list[str] | None = Field(None, description="Flags kvlab passed beyond the "
                                          "seed script's, the same on every compared role.")
    memory_kind: str | None = Field(None, description="unified (the GPU's memory is the "
                                    "host's), discrete, none (CPU build) or unknown.")
    host_memory: HostTierCheck | None = None
    side_channel: SideChannelAddress | None = None
    visible_devices: str | None = Field(None, description="The cards it was given "
                                        "(PREFILL_DEVICES/DECODE_DEVICES), as the variable set.")


class ResetProbe(Strict):
    """The check that a kept engine's prefix cache was emptied before it served another
    experiment: one prompt sent twice (the second must hit, or a miss would prove nothing),
    the cache reset, the prompt again (it must miss)."""

    method: str = Field(description="The reset as sent, e.g. POST /reset_prefix_cache.")
    prompt_tokens: int = Field(description="The probe prompt's tokens, as the engine counted.")
    cached_before: int = Field(description="Cached tokens of its second send, before the reset.")
    cached_after: int = Field(description="Cached tokens of its send after the reset.")
    reset_s: float = Field(description="Seconds for the whole check, probe and resets.")

    @property
    def ok(self) -> bool:
        return self.cached_before > 0 and self.cached_after == 0


class EngineReuse(Strict):
    """This startup line's engine was not started for it: it is the one the line labelled
    `started_as` started earlier in the pass, kept with an identical plan and reset."""

    started_as: str
    start_ready_s: float | None = Field(None, description="That start's time to ready: what "
                                        "this reuse saved.")
    probe: ResetProbe


class StartupRecord(Record, StartupFacts):
    """What an instance said about its KV capacity as it started."""

    kind: ClassVar[str] = "startup"
    record: Literal["startup"] = "startup"
    engine: str
    engine_version: str = "unknown"
    version_note: str | None = Field(None, description="Said when the engine is not the "
                                     "build kvlab's facts for it are pinned for.")
    role: str
    model: str = ""
    served_name: str = ""
    base_url: str = ""
    argv: list[str] = Field(default_factory=list)
    ready_s: float | None = None
    capacity: KvCapacity = Field(default_factory=KvCapacity)
    context_tokens: int | None = Field(None, description="The context length it was started "
                                       "with (vLLM's --max-model-len, llama.cpp's --ctx-size).")
    memory_fraction: float | None = Field(None, description="vLLM's --gpu-memory-utilization.")
    node: NodeInfo | None = Field(None, description="The Ray node it ran on.")
    instance: str | None = Field(None, description="Its process's identity on this machine "
                                 "(session and start time): the key a load row that "
                                 "measured it finds this line by.")
    engine_args: EngineArgs | None = Field(None, description="Its effective arguments as the "
                                           "engine logged them at start, else its argv.")
    reused: EngineReuse | None = Field(None, description="Set when the engine was kept from "
                                       "an earlier experiment of the pass and reset, not "
                                       "started: ready_s is then the reset's check.")
    start_batch: str | None = Field(None, description="Shared by the engines started "
                                    "together (their starts overlapped: the run's time in "
                                    "starts counts the batch's longest time to ready once).")


# --- reuse and proof ---------------------------------------------------------------------


class Fitted(Strict):
    """The preamble fitted to the served context in the model's own tokens."""

    preamble_words: int
    asked_words: int
    context_tokens: int | None = None
    last_turn_tokens: int | None = None
    counted_by: str


class Turn(Strict):
    """One request's evidence from llama-server: client TTFT and the server's reuse counts."""

    ttft_s: float | None = None
    total_s: float | None = None
    cache_n: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    top_logprobs: list[tuple[str, float]] = Field(default_factory=list)


class SlotOpLine(Strict):
    """One slot action: the server's own figures and the wall time around the call."""

    action: str
    slot: int
    filename: str | None = None
    n_tokens: int
    n_bytes: int | None = None
    server_ms: float | None = None
    wall_ms: float


class ChatTiming(Strict):
    """One streamed answer as the client timed it and the server counted it."""

    endpoint: str | None = None
    ttft_s: float | None = Field(None, description="To the first token, answer or reasoning "
                                 "(`observe/sse.py` defines it).")
    ttft_answer_s: float | None = Field(None, description="To the first answer token "
                                        "(`delta.content`); after the thinking of a model "
                                        "that reasons.")
    ttft_reasoning_s: float | None = Field(None, description="To the first reasoning token "
                                           "(`delta.reasoning[_content]`); None when none came.")
    total_s: float | None = None
    chunks: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, float] | None = Field(None, description="llama-server's own timings "
                                             "of the answer.")
    ttft_from: str | None = Field(None, description="What TTFT was timed to, when not the "
                                  "first token.")


class ReuseRow(ChatTiming):
    """One turn of a conversation (measure-reuse.py's row, kvlab's evidence added)."""

    turn: int
    endpoint: str
    counter_deltas: Deltas | None = None
    expected_tokens: int | None = None
    verdict: str | None = None


class ReuseSummary(Strict):
    """A conversation's turns, summed up."""

    turn1_ttft_s: float | None = None
    best_later_ttft_s: float | None = None
    best_later_ratio: float | None = None
    later_turn_verdicts: list[Verdict] = Field(default_factory=list)
    reused_turns: int = 0
    hit_rate: dict[str, float | None] = Field(default_factory=dict)


class SlotEvidence(Strict):
    """llama.cpp's slot round trip: the cold, control and restored requests, the save and
    restore themselves, and the logprobs that show the restored cache is the same."""

    cold: Turn | None = None
    control: Turn | None = None
    restored: Turn | None = None
    cold_a: Turn | None = None
    restored_b: Turn | None = None
    cold_b_control: Turn | None = None
    logprob_max_abs_diff: float | None = None
    logprob_tolerance: float | None = None
    save: SlotOpLine | None = None
    restore: SlotOpLine | None = None
    slot_file: str | None = None
    file_kept: bool | None = None


class ReuseRecord(Record, KvType):
    """The seed's measure-reuse.py record: a growing conversation, TTFT per turn."""

    kind: ClassVar[str] = "reuse"
    record: Literal["reuse"] = "reuse"
    model: str | None = None
    endpoints: list[str] = Field(default_factory=list)
    turns: int | None = None
    preamble_words: int | None = None
    max_tokens: int | None = None
    rows: list[ReuseRow] = Field(default_factory=list)
    metric_deltas: PerUrl = Field(default_factory=dict)
    note: str | None = None
    nonce: str | None = Field(None, description="The run's own opening (kvlab reuse): no "
                              "earlier run's cache can serve its turn 1.")
    fitted: Fitted | None = None
    temperature: float | None = None
    connector: str | None = None
    summary: ReuseSummary | None = None
    instances: dict[str, InstanceLine] = Field(default_factory=dict)
    turn_reasons: list[list[str]] = Field(default_factory=list)
    warm_up_ttft_s: dict[str, float | None] = Field(default_factory=dict)
    tier: str | None = None
    pressure: Pressure | None = None
    repeat: int | None = None
    # llama.cpp's slot store shared by two servers (`kvlab run shared-slots`)
    engine: str | None = None
    engine_version: str | None = None
    model_sha256: str | None = None
    prompt_tokens: int | None = None
    mechanism: str | None = None
    verdict: str | None = None
    reasons: list[str] = Field(default_factory=list)
    evidence: SlotEvidence | None = None
    server: LlamaServerLine | None = None


class CaseEvidence(Strict):
    """The figures one case's verdict was drawn from."""

    expected_tokens: int | None = None
    observed_tokens: float | None = None
    observed_fraction: float | None = None
    cached_tokens: int | None = None
    counter_hits: float | None = None
    source_tokens: float | None = None
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    cold_ttft_s: float | None = None
    ttft_ratio: float | None = None
    cause: str | None = Field(None, description="What the instance reports that explains no "
                              "reuse (prefix caching off).")


class ProofCase(Strict):
    """One case of a proof: what was sent where, what came back, the verdict."""

    case: str
    endpoint: str
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    counter_deltas: Deltas | None = None
    verdict: str | None = None
    reasons: list[str] = Field(default_factory=list)
    evidence: CaseEvidence | None = None


class ProofRecord(Record):
    """`kvlab prove`: cold, identical, changed-prefix control, each with its verdict."""

    kind: ClassVar[str] = "proof"
    record: Literal["proof"] = "proof"
    model: str
    endpoints: list[str]
    cases: list[ProofCase]
    verdicts: dict[str, str | None]
    explanations: list[str] = Field(default_factory=list)
    note: str = ""
    preamble_words: int | None = None
    max_tokens: int | None = None
    connector: str | None = None
    salt: bool | None = None
    instances: dict[str, InstanceLine] = Field(default_factory=dict)


# --- comparisons -------------------------------------------------------------------------


class RatioInterval(Strict):
    """A ratio between two sides with its 95% interval over requests (and repeats)."""

    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    words: str
    requests: list[int] | None = None
    repeats: list[int] | None = None


class ComparisonLevel(Strict):
    """One level both sides share: each side's figures, their ratios and intervals."""

    concurrency: int
    ttft_p50_disagg_s: float | None = None
    ttft_p50_baseline_s: float | None = None
    tpot_p50_disagg_s: float | None = None
    tpot_p50_baseline_s: float | None = None
    tpot_p50: str | None = Field(None, description="Why the level has no TPOT ratio, in words "
                                 "(a side's rows have no tpot_s).")
    output_tokens_per_s_disagg: float | None = None
    output_tokens_per_s_baseline: float | None = None
    failed_disagg: int | None = None
    failed_baseline: int | None = None
    intervals: dict[str, RatioInterval] | None = None
    # an interference comparison: a candidate against the run with the most slots
    candidate_label: str | None = None
    llama_parallel: int | None = None
    ttft_p50_candidate_s: float | None = None
    ttft_p50_ratio: float | None = None
    tpot_p50_candidate_s: float | None = None
    tpot_p50_ratio: float | None = None
    output_tokens_per_s_candidate: float | None = None
    output_tokens_per_s_ratio: float | None = None
    failed: int | None = None
    cached_tokens_mean_candidate: float | None = None
    cached_tokens_mean_baseline: float | None = None
    repeats: int | None = None


class NixlTransfer(Strict):
    """NIXL's own timing of its transfers over a run."""

    transfers: float
    bytes_per_transfer: float
    seconds_per_transfer: float
    gbit_per_s: float


class BytesEvidence(Strict):
    """The bytes a split moved, three ways, against the KV arithmetic's prediction."""

    predicted_bytes_per_request: float | None = None
    prompt_tokens: Number | None = None
    prompt_tokens_from: str | None = None
    observed_bytes_per_request_by_source: dict[str, float] = Field(default_factory=dict)
    verdict: str | None = None
    verdict_source: str | None = None
    decode_computed_share: float | None = None
    nixl_transfer: NixlTransfer | None = None


class IntervalMethod(Strict):
    """How a comparison's intervals were drawn."""

    confidence: float
    resamples: int
    seed: int
    scheme: str
    output_tokens_per_s: str | None = None


class LevelPressure(Strict):
    """One level's pressure, as the report judges it (`report/pressure.py`), with the figures
    that decided it."""

    state: str
    why: str
    preemptions: float | None = None
    peak_kv_cache_usage: float | None = None
    prefix_hit_rate: float | None = None
    reusable_fraction: float | None = None
    prompt_tokens_in_flight: int | None = None


class SidePressure(Strict):
    """One side of a tier comparison: its cache and whether any level was under pressure."""

    kv_cache_tokens: int | None = None
    kv_cache_tokens_from: str | None = None
    levels: dict[str, LevelPressure] = Field(default_factory=dict)
    under_pressure: bool | None = None


class ComparisonRecord(Record, Where):
    """compare-disagg.py's record: two labels' load rows paired level by level."""

    kind: ClassVar[str] = "comparison"
    record: Literal["comparison"] = "comparison"
    disagg_label: str | None = None
    baseline_label: str | None = None
    engines: dict[str, list[EngineLine]] | None = Field(None, description="Each label's "
                                                        "engines, whose arguments were "
                                                        "compared.")
    model: str | None = None
    prompt_set: str | None = None
    iface: str | None = None
    kv_bytes_per_token: float | None = None
    prompt_tokens: Number | None = None
    predicted_bytes_per_request: float | None = None
    observed_bytes_per_request: float | None = None
    levels: list[ComparisonLevel] = Field(default_factory=list)
    same_experiment: bool | None = None
    note: str | None = None
    differences: list[str] = Field(default_factory=list)
    bytes: BytesEvidence | None = None
    kv_cache_type: dict[str, str | None] | None = Field(None, description="Each side's KV "
                                                        "element type, by label.")
    side_channel: SideChannel | None = None
    offload: bool | None = None
    pressure: dict[str, SidePressure] | None = Field(None, description="A tier pair: each "
                                                     "side's pressure, by label.")
    interval_method: IntervalMethod | None = None
    transfer_predicted_s: float | None = None
    link_gbps_predicted: float | None = None
    # an interference comparison: runs that vary one setting against the first
    experiment: str | None = None
    candidate_labels: list[str] | None = None
    varied: dict[str, list[int]] | None = None
    held_fixed: list[str] | None = None
    differs: list[str] | None = None
    ctx: int | None = None


class KvPrediction(Strict):
    """The KV arithmetic for one model shape and one workload (`measure/kvmath.py`), in
    canonical units (bytes, seconds)."""

    source: str | None = Field(None, description="The config.json the shape was read from.")
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    bytes_per_token: float | None = None
    prompt_tokens: int | None = None
    block_size: int | None = None
    payload_bytes: float | None = None
    payload_bytes_block_aligned: float | None = None
    link_bytes_per_s: float | None = None
    transfer_s: float | None = None
    transfer_s_block_aligned: float | None = None
    kv_cache_tokens: int | None = None
    ctx: int | None = None
    max_concurrency: float | None = None
    ttft_prediction: str | None = None


class PredictionRecord(Record, Where, KvPrediction):
    """The P/D lab's prediction, written before any run."""

    kind: ClassVar[str] = "prediction"
    record: Literal["prediction"] = "prediction"
    model: str | None = None
    note: str | None = None


class CrossingRecord(Record, Where):
    """`kvlab proxy --check`: did one request cross both legs of the split."""

    kind: ClassVar[str] = "crossing"
    record: Literal["crossing"] = "crossing"
    crossed: bool
    reasons: list[str] = Field(default_factory=list)
    proxy: str | None = None
    status: int | None = None
    request_id: str | None = None
    kv_transfer_header: str | None = None
    prompt_tokens: int | None = None
    block_size: int | None = None
    expected_external_hits: int | None = None
    seconds: float | None = None
    prefill: PerUrl = Field(default_factory=dict)
    decode: PerUrl = Field(default_factory=dict)


class NotRunRecord(Record):
    """A lab row that cannot be measured on this machine, and why."""

    kind: ClassVar[str] = "not-run"
    record: Literal["not-run"] = "not-run"
    row: str
    reason: str


# --- llama.cpp's disk tier ---------------------------------------------------------------


class DiskRecord(Record, KvType):
    """llama.cpp slot save and restore, timed against a cold prefill."""

    kind: ClassVar[str] = "disk"
    record: Literal["disk"] = "disk"
    engine: str
    engine_version: str | None = None
    model: str
    model_sha256: str | None = None
    prompt_tokens: int
    max_tokens: int | None = None
    cold_ttft_s: float | None = None
    save_ms: float | None = None
    save_server_ms: float | None = None
    restore_ms: float | None = None
    restore_server_ms: float | None = None
    file_bytes: int | None = None
    saved_tokens: int | None = None
    restored_tokens: int | None = None
    post_restore_ttft_s: float | None = None
    post_restore_cached_tokens: int | None = None
    restore_cold_ratio: float | None = None
    restore_cold_ratio_server: float | None = None
    verdict: str
    reasons: list[str] = Field(default_factory=list)
    evidence: SlotEvidence | None = None
    server: LlamaServerLine | None = None
    note: str | None = None


# --- the P/D lab's procedure steps --------------------------------------------------------


class Check(Strict):
    """One check of a procedure step, with the figures that decided it."""

    name: str
    passed: bool
    detail: str


class StreamCut(Strict):
    """The cancelled stream, as the client and decode saw it at the cut."""

    status: int | None = None
    tokens: int = Field(0, description="Token chunks received before the connection closed.")
    finished: bool = Field(False, description="The answer ended before the cut.")
    first_token_s: float | None = None
    closed_after_s: float | None = None
    error: str | None = None
    decode_generated: float | None = Field(None, description="Decode's tokens generated at "
                                           "the cut (None: its /metrics could not be read).")
    decode_running: float | None = None

    @property
    def late(self) -> bool:
        """Decode had nothing running at the cut: it had already finished the answer."""
        return self.decode_running is not None and self.decode_running < 1


class Restart(Strict):
    """Decode stopped and started again from the same plan."""

    ok: bool = False
    exit_code: int | None = None
    stop_s: float | None = None
    ready_s: float | None = None
    pids: list[int | None] = Field(default_factory=list)
    first_log: str | None = None
    error: str | None = None


class Fresh(Strict):
    """A fresh request through the proxy after the restart."""

    status: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


class CancelSpecLine(Strict):
    """The sizes the cancel step ran with."""

    prompt_tokens: int | None = None
    max_tokens: int
    cancel_after: int
    fresh_prompt_tokens: int
    fresh_max_tokens: int
    settle_s: float


class CancelEvidence(Strict):
    """Every figure the cancel step's checks read, as gathered (None: could not be read)."""

    max_tokens: int
    expected_tokens: int
    cut: StreamCut = Field(default_factory=StreamCut)
    attempts: int = Field(1, description="Cuts made: one more each time the cut came after "
                          "decode finished.")
    proxy_aborted: float | None = None
    proxy_aborts_by_stage: dict[str, float | None] = Field(default_factory=dict)
    decode: Deltas = Field(default_factory=dict, description="Decode's evidence deltas over "
                           "the cancel.")
    settled_s: float | None = Field(None, description="None: not settled in time.")
    restart: Restart = Field(default_factory=Restart)
    health: dict[str, str] = Field(default_factory=dict, description="prefill, decode, proxy: "
                                   "ok or why not.")
    fresh: Fresh = Field(default_factory=Fresh)
    fresh_served: dict[str, float | None] = Field(default_factory=dict)
    spec: CancelSpecLine | None = None


class ProcedureRecord(Record):
    """A P/D lab procedure step, checked (`kvlab run disagg --part cancel`)."""

    kind: ClassVar[str] = "procedure"
    record: Literal["procedure"] = "procedure"
    step: str = Field(description="cancel-restart: a request cancelled mid-stream through the "
                      "proxy, then the decode worker restarted.")
    verdict: Literal["pass", "fail"]
    checks: list[Check] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list, description="Names of the failed checks.")
    evidence: CancelEvidence | None = None


class BoundaryPointRecord(Record, Where, LevelFigures):
    """One prompt length on one side of the long- against short-prompt sweep."""

    kind: ClassVar[str] = "boundary-point"
    record: Literal["boundary-point"] = "boundary-point"
    side: Literal["split", "baseline"]
    prompt_tokens_target: int = Field(description="The length swept to, in the model's tokens.")
    concurrency: int
    requests: int
    base_url: str | None = None
    failures: list[Failure] = Field(default_factory=list)
    max_tokens: int | None = None
    metric_deltas: Deltas = Field(default_factory=dict)


class BoundaryCell(Strict):
    """One prompt length of the sweep, both sides."""

    prompt_tokens_target: int
    split_ttft_p50_s: float | None = None
    baseline_ttft_p50_s: float | None = None
    ratio: float | None = None
    split_prompt_tokens: float | None = None
    baseline_prompt_tokens: float | None = None
    split_tokens_from_store: float | None = None


class BoundaryRecord(Record):
    """Where the split starts or stops paying in TTFT, found by sweeping the prompt length."""

    kind: ClassVar[str] = "boundary"
    record: Literal["boundary"] = "boundary"
    concurrency: int
    verdict: Literal["pays-above", "pays-below", "pays-everywhere", "pays-nowhere", "mixed",
                     "not-enough-evidence"]
    statement: str
    crossing_tokens: float | None = Field(None, description="Where the split/baseline TTFT "
                                          "p50 ratio crosses 1.0 (interpolated), if once.")
    points: list[BoundaryCell] = Field(default_factory=list)
    requests_per_point: int | None = None
    max_tokens: int | None = None


# --- llama.cpp's quantised KV cache against f16 --------------------------------------------
class KvTypeSide(Strict):
    """One llama-server of the quantised-cache comparison, as its startup log and load row
    measured it."""

    kv_type: str
    label: str = Field(description="The label of its load row.")
    ctx: int = Field(description="The --ctx-size it was started with.")
    kv_cache_bytes: int | None = Field(None, description="The KV cache as the server "
                                       "allocated it (its startup line).")
    kv_cache_tokens: int | None = Field(None, description="Cells of that cache: the tokens "
                                        "that fit.")
    ttft_p50_s: float | None = None
    long_prompt: str = Field("not tried", description="A prompt longer than the f16 side "
                             "holds: served, or the server's refusal.")


class KvQuantRecord(Record):
    """llama.cpp's quantised KV cache against f16 in the same memory: the tokens each holds,
    TTFT, and how far the quantised cache moves the first token's logprobs."""

    kind: ClassVar[str] = "kv-quant"
    record: Literal["kv-quant"] = "kv-quant"
    engine: str
    engine_version: str | None = None
    model: str
    memory_bytes: int | None = Field(None, description="The KV budget both sides had: the "
                                     "reference's cache.")
    reference: KvTypeSide
    candidate: KvTypeSide
    tokens_ratio: float | None = Field(None, description="Candidate tokens / reference "
                                       "tokens in that memory.")
    ttft_p50: RatioInterval | None = Field(None, description="Candidate / reference, with "
                                           "its interval over requests.")
    prompt_tokens: int | None = Field(None, description="The prompts both sides were timed "
                                      "on.")
    long_prompt_tokens: int | None = None
    logprob_gap: float | None = Field(None, description="Largest |difference| of the first "
                                      "token's top logprobs, the same prompt on both sides.")
    top_token_same: bool | None = None
    verdict: str
    reasons: list[str] = Field(default_factory=list)


# --- the user's own answers (task 6) -------------------------------------------------------
NOTE_TOPICS = ("host-tier", "store", "disk", "quantised", "configuration")


class NoteRecord(Record):
    """The user's own answer to one of the labs' questions (`kvlab note`), in their words,
    shown beside the answer kvlab drafted from the rows."""

    kind: ClassVar[str] = "note"
    record: Literal["note"] = "note"
    about: Literal["host-tier", "store", "disk", "quantised", "configuration"]
    text: str = Field(min_length=1, max_length=2000)
