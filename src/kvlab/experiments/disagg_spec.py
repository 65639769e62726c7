"""What `kvlab run disagg` is asked: its parts, sizes and procedures (`DisaggSpec`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.experiments import repeats
from kvlab.experiments.boundary import (
    BoundarySpec,
)
from kvlab.experiments.procedure import CancelSpec
from kvlab.loadgen import CapacityAsk
from kvlab.proxy import Balance

# `kvlab run disagg --part`: the load comparison (the default) and the lab's procedure steps
DISAGG_PARTS = ("load", "cancel", "boundary")
LOAD, CANCEL, BOUNDARY = DISAGG_PARTS


@dataclass(frozen=True)
class DisaggSpec:
    levels: tuple[int, ...] = (1, 4, 8)
    requests: int | None = None  # None: the load generator's default per level
    max_tokens: int = 128
    preamble_tokens: int = 4096
    prompt_set: str = "shared-prefix"
    link_gbps: float | None = None
    parts: tuple[str, ...] = (LOAD,)
    cancel: CancelSpec = field(default_factory=CancelSpec)
    boundary: BoundarySpec = field(default_factory=BoundarySpec)
    capacity: CapacityAsk | None = None  # --part load: the highest request rate at a target
    repeat: int = 1  # --part load: each side's load this many times, in alternating order
    rule: repeats.Sequential | None = None  # --repeat auto: until settled, `repeat` the cap
    label: str = "disagg"  # the split's rows (the baseline's are `baseline`)
    balance: Balance = "round-robin"  # how the proxy picks among several prefills or decodes
    together: bool = False  # one round: the split and the baseline start at once (run all)

    def has(self, part: str) -> bool:
        return part in self.parts
