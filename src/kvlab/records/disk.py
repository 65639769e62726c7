"""The disk tier: a prompt's KV saved to a file and restored (llama.cpp's slot save and restore,
mlx-lm's prompt-cache file), timed against a cold prefill (`disk`), with the round trip's
evidence: each request of it, each slot action, the logprobs that show the restored cache is
the same.

The `reuse` line of two servers sharing a slot store carries the same evidence (`reuse.py`
takes it from here); a host tier in memory is measured by load rows (`load.py`), not here.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Record, Strict
from kvlab.records.evidence import KvType, LlamaServerLine


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
