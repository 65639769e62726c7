"""The `capacity` line: the highest load that met a latency target (`kvlab load
--find-capacity`), with the target, how the search probed, and each probe's figures against
each bound.

Each probe's rows are `load` lines (`load.py`, whose `CapacityProbe` says which probe a row
is); no row's statistics are here.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Number, Record, Strict
from kvlab.records.load import RunContext
from kvlab.records.workload import Workload


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
    decided_by: str | None = Field(None, description="The run's own level (its label) that "
                                   "answered without a probe: one request at a time missed "
                                   "the target, so no load meets it.")
