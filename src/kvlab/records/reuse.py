"""Reuse measured request by request: the `reuse` line (the seed's measure-reuse.py record, a
growing conversation with TTFT and a verdict per turn; also llama.cpp's slot store shared by
two servers) and the `proof` line (`kvlab prove`: cold, identical and changed-prefix cases,
each with its verdict), with the verdict's words and each turn's and case's evidence.

The slot round trip a shared-slots reuse line carries is declared with the disk tier that owns
it (`disk.py`); the cached tokens of a load level are the load row's (`load.py`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Deltas, Record, Strict
from kvlab.records.disk import SlotEvidence
from kvlab.records.evidence import InstanceLine, KvType, LlamaServerLine, PerUrl
from kvlab.records.pressure import Pressure

Verdict = Literal["reused", "silent-miss", "warm-up-only", "no-reuse-expected", "inconclusive"]
"""Did a request reuse KV, and if not, was that expected (`measure/verdict.py` decides)."""


class Fitted(Strict):
    """The preamble fitted to the served context in the model's own tokens."""

    preamble_words: int
    asked_words: int
    context_tokens: int | None = None
    last_turn_tokens: int | None = None
    counted_by: str


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


class StoreHeld(Strict):
    """What a KV store held, as the store itself says."""

    source: str = Field(description="Where the figures came from (LMCache's /status).")
    objects: int = Field(description="Entries it holds (LMCache: chunks).")
    bytes: int = Field(description="Bytes those entries take.")
    capacity_bytes: int | None = None
    chunk_tokens: int | None = Field(None, description="Tokens an entry holds (LMCache's "
                                     "chunk), for bytes per token against the KV arithmetic.")


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
    store: StoreHeld | None = Field(None, description="What the store the instances share held "
                                    "after the run, as it says (LMCache's server).")


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
