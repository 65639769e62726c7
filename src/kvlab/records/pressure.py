"""A tier measurement's pressure, stated: the pressure a run was sized for, what it reached by
the engine's own gauges and counters, and what a host tier held and moved.

`load` and `reuse` lines carry it; judging a level's pressure from these figures is
`measure/pressure.py`'s, and a comparison's per-side judgement is `comparison.py`'s
(`LevelPressure`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvlab.records.base import Strict


class PressurePlanned(Strict):
    """The pressure a run was sized for (`experiments/pressure_plan.py`)."""

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
