"""The physical floor under a tier: how fast this machine copies KV between the memories a
tier moves it across, measured with the engine's own framework (`copy-rate` lines).

A recall cannot be faster than its bytes over this rate; the report sets that floor beside
the time the engine's own counters say its loads took and beside recomputing the same tokens.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Record


class CopyRateRecord(Record):
    """One copy-rate probe: a buffer copied several times, the best time kept."""

    kind: ClassVar[str] = "copy-rate"
    record: Literal["copy-rate"] = "copy-rate"
    direction: Literal["host-to-device", "device-to-host", "host-memory"] = Field(
        description="host-to-device: pinned host memory into the GPU (a recall from a host "
        "tier); host-memory: one host buffer into another (where there is no device).")
    bytes: int = Field(gt=0, description="The buffer copied each time.")
    copies: int = Field(gt=0)
    best_s: float = Field(gt=0, description="The fastest copy's seconds.")
    gb_per_s: float = Field(gt=0, description="bytes / best_s / 1e9.")
    framework: str = Field(description="What copied, as it names itself (torch and its version).")
    device: str = Field("", description="The device, as the framework names it.")
    source: str = Field(description="How the figure was taken (the interpreter that ran it).")
