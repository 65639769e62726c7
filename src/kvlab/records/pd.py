"""The P/D lab's own lines beside its load rows: the `prediction` written before any run (the KV
arithmetic), the `crossing` check that one request crossed both legs of the split, the
`procedure` step that cancels a request mid-stream and restarts decode, and the prompt-length
sweep (`boundary-point` per length and side, `boundary` for where the split pays).

The split's load rows are `load.py`'s and its link counters `link.py`'s; its comparison against
the baseline is `comparison.py`'s.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Deltas, Record, Strict
from kvlab.records.evidence import Failure, PerUrl, Where
from kvlab.records.load import LevelFigures


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

    def failing(self) -> bool:
        return self.verdict == "fail"


# --- long against short prompts: where the split pays -----------------------------------


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
