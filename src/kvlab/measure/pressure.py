"""Was a load run's KV cache under pressure? One judgement, from evidence the run measured.

A host tier does nothing until blocks are evicted and wanted again, so every reader of a
tier's load rows (`kvlab compare`, with or without `--offload`, the report's pressure rows and
the lab's closing decision) asks this one question, here, and gets the same answer:

- under pressure: preemptions during the run; prompts the engine logged moving out of the
  device cache to its host tier to make room (llama-server's RAM cache); peak KV usage at or
  above `FULL`; a prefix hit
  rate well below the share of prompt tokens that was reusable (blocks were evicted); or more
  prompt tokens in flight than the cache holds;
- quiet: a hit rate close to the reusable share; or no preemptions and either a peak usage
  below `FULL` or the tokens in flight within the cache;
- unknown: none of these was measured. Never "quiet" by default: an unknown cache size is no
  evidence of room.

The cache size comes from the run's `startup` line, else the pressure the run planned, else
the engine's own /metrics as the load generator recorded it (`kv_cache_tokens`, vLLM's
`vllm:cache_config_info`), so an engine kvlab did not start still has one. Pure functions of
the notebook's records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.records import (
    PRESSURE_OFF,
    PRESSURE_ON,
    LevelPressure,
    LoadRecord,
    PressurePlanned,
    Record,
    RunContext,
    StartupRecord,
)

FULL = 0.95  # peak KV usage at or above this: the cache was full
EVICTED = 0.9  # a hit rate below this share of the reusable share: blocks were evicted


@dataclass(frozen=True)
class Evidence:
    """The figures a judgement reads, as the run measured them (None: not measured)."""

    preemptions: float | None = None
    peak_kv_cache_usage: float | None = None
    prefix_hit_rate: float | None = None
    reusable_fraction: float | None = None
    prompt_tokens_in_flight: int | None = None
    tier_stores: int | None = None  # prompts the device gave up to the host tier for others


@dataclass(frozen=True)
class Pressure:
    """The judgement for one load row, with the figure that decided it."""

    state: bool | None  # True under pressure, False quiet, None unknown
    why: str
    cache_tokens: int | None = None
    cache_from: str | None = None
    evidence: Evidence = field(default_factory=Evidence)

    @property
    def words(self) -> str:
        return {True: "under pressure", False: "quiet (not under pressure)",
                None: "pressure unknown"}[self.state]

    def level(self) -> LevelPressure:
        """The judgement as a comparison line holds it for one level."""
        ev = self.evidence
        return LevelPressure(state=self.words, why=self.why, preemptions=ev.preemptions,
                             peak_kv_cache_usage=ev.peak_kv_cache_usage,
                             prefix_hit_rate=ev.prefix_hit_rate,
                             reusable_fraction=ev.reusable_fraction,
                             prompt_tokens_in_flight=ev.prompt_tokens_in_flight)


def same_engines(label: str) -> tuple[str, ...]:
    """`label`, and the label whose startup lines a tier's load under pressure may share its
    engines with (`Row.startup`: an older notebook started `offload-on-load`'s engines as
    `offload-on`)."""
    rows = [row for row in (PRESSURE_OFF, PRESSURE_ON) if row.label == label]
    return (label, *(startup for row in rows for startup in row.startup))


def planned(row: RunContext) -> PressurePlanned | None:
    """The pressure a row's run was sized for, if it was."""
    return row.pressure.planned if row.pressure is not None else None


def preemptions(row: LoadRecord) -> float | None:
    """Preemptions over the run: as the pressure it reached recorded them, else the engine's
    own counter delta."""
    reached = row.pressure.reached if row.pressure is not None else None
    if reached is not None and reached.preemptions is not None:
        return reached.preemptions
    return row.metric_deltas.get("preemptions")


def cache_size(records: list[Record], row: LoadRecord) -> tuple[int | None, str | None]:
    """The device KV cache's size in tokens for a load row, and where it was read."""
    labels = same_engines(row.label)
    starts = [r for r in records if isinstance(r, StartupRecord) and r.label in labels]
    size = starts[-1].capacity.kv_cache_tokens if starts else None
    if size:
        return int(size), "the startup line"
    plan = planned(row)
    if plan is not None and plan.cache_tokens:
        return int(plan.cache_tokens), "the pressure plan"
    told = row.metric_deltas.get("kv_cache_tokens")
    if told:
        return int(told), "the engine's /metrics"
    return None, None


def judge_pressure(records: list[Record], row: LoadRecord) -> Pressure:
    """Under pressure, quiet, or unknown, for one load row (see the module docstring)."""
    plan = planned(row)
    reached = row.pressure.reached if row.pressure is not None else None
    cache, source = cache_size(records, row)
    ev = Evidence(preemptions=preemptions(row),
                  peak_kv_cache_usage=reached.peak_kv_cache_usage if reached else None,
                  prefix_hit_rate=row.prefix_hit_rate,
                  reusable_fraction=plan.reusable_fraction if plan else None,
                  prompt_tokens_in_flight=round(row.concurrency * row.prompt_tokens_mean)
                  if row.prompt_tokens_mean else None,
                  tier_stores=reached.host_tier.stores if reached and reached.host_tier
                  else None)
    pressed = _pressed(ev, cache)
    if pressed:
        return Pressure(True, pressed, cache, source, ev)
    quiet = _quiet(ev, cache)
    if quiet:
        return Pressure(False, quiet, cache, source, ev)
    return Pressure(None, "no preemption count, peak KV usage, reusable share or cache size "
                          "was recorded", cache, source, ev)


def _pressed(ev: Evidence, cache: int | None) -> str:
    preempted, peak = ev.preemptions, ev.peak_kv_cache_usage
    hit, reusable, flight = ev.prefix_hit_rate, ev.reusable_fraction, \
        ev.prompt_tokens_in_flight
    if preempted:
        return f"{float(preempted):g} preemptions"
    if ev.tier_stores:
        return (f"{ev.tier_stores} prompts left the device cache for the host tier to make "
                "room for other conversations (the engine's log)")
    if peak is not None and peak >= FULL:
        return f"peak KV usage {peak:.0%}"
    if hit is not None and reusable and hit < EVICTED * reusable:
        return (f"prefix hit rate {hit:.1%} where {reusable:.1%} of the prompt tokens were "
                "reusable: blocks were evicted")
    if cache and flight and flight > cache:
        return f"{flight:,} prompt tokens in flight against a cache of {cache:,}"
    return ""


def _quiet(ev: Evidence, cache: int | None) -> str:
    preempted, peak = ev.preemptions, ev.peak_kv_cache_usage
    hit, reusable, flight = ev.prefix_hit_rate, ev.reusable_fraction, \
        ev.prompt_tokens_in_flight
    if hit is not None and reusable:  # nothing evicted that was wanted again
        return (f"prefix hit rate {hit:.1%} of {reusable:.1%} reusable, "
                + ("no preemptions" if preempted is not None else "preemptions not recorded"))
    if preempted is None:
        return ""
    if peak is not None:
        return f"no preemptions, peak KV usage {peak:.0%}"
    if cache and flight is not None:
        return (f"no preemptions, and the {flight:,} prompt tokens in flight fit the cache "
                f"of {cache:,}")
    return ""


def tier_holds(plan: PressurePlanned | None) -> bool | None:
    """Could the run's host tier hold the working set it planned? None: no tier, or the plan
    does not say enough. vLLM's tier keeps a copy of every block it stores, so it must hold the
    whole working set, not only what the device lost, for no returning conversation to be
    lost. A tier too small for it is another experiment than one that holds it."""
    if plan is None or not plan.host_tier_bytes or not plan.bytes_per_token:
        return None
    return float(plan.host_tier_bytes) / float(plan.bytes_per_token) >= plan.working_set_tokens


def tier_too_small(row: RunContext) -> bool:
    """Did this row (a load row, a capacity search) run with a host tier smaller than its
    planned working set?"""
    return tier_holds(planned(row)) is False
