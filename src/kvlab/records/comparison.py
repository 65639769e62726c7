"""Lines that set one run against another: the `comparison` (compare-disagg.py's record: two
labels' load rows paired level by level, their ratios with intervals, the bytes a split moved,
each side's pressure) and `kv-quant` (llama.cpp's quantised KV cache against f16 in the same
memory), with the ratio and interval both carry.

The rows compared are the load rows (`load.py`); the P/D lab's prediction and its prompt-length
sweep are `pd.py`'s.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Number, Record, Strict
from kvlab.records.evidence import EngineLine, SideChannel, Where


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
    """One level's pressure, as the report judges it (`measure/pressure.py`), with the figures
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
