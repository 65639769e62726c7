"""`kvlab run all`: every experiment this machine can run, then the report.

Order (the registry's `RUN_ALL`): the llama.cpp tiers first (a minute or two), then the vLLM
experiments (offload, shared store, prefill/decode). Each experiment installs what its engines
need (`engines/prepare.py`: for this machine's device, never the CPU's on a GPU) and starts
its own engines; an engine whose plan is the previous step's is kept instead of restarted,
its prefix cache reset and the reset checked (`engines/reuse.py`). One that fails (an engine
that dies, a refused configuration) is recorded as a `not-run` line for each of its report
rows, with the error, everything it started is stopped, and the rest still run. Sizes:
`AllSpec.lab()` are the labs' own; `AllSpec.quick()` are for CI and a first look. Both search
the capacity at the platform's latency target (the offload lab's users with the tier off, and
on where it runs; the P/D lab's request rate, baseline and split): a few probes of a few
seconds in `quick()`, more and longer in `lab()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.cluster.placement import LOCAL, Placement
from kvlab.core import GPU_PROFILES, KvlabError, LoadedSettings, Say, Settings, quiet
from kvlab.engines import NAMES, EnginePool, engine_for, prepare_engines
from kvlab.experiments import DISAGG_PARTS, EXPERIMENTS, RUN_ALL
from kvlab.experiments.lab import Lab
from kvlab.loadgen import CapacityAsk, SearchPlan
from kvlab.records import Record

Done = Callable[[list[str]], None] | None  # told the experiments not run yet

# capacity searches: the labs' (six probes of six seconds) and quick ones (two of two)
LAB_SEARCH = SearchPlan(start=2.0, max_steps=6, duration_s=6.0, min_requests=20, warmup=2)
QUICK_SEARCH = SearchPlan(start=2.0, max_steps=2, duration_s=2.0, min_requests=6, warmup=1)

# llama.cpp's slot experiments time files kvlab writes and reads where it runs
SLOT_FILES_HERE = ("disk", "mlx-cache", "shared-slots")
NOT_PLACED = ("not placed on a Ray node: kvlab times llama.cpp's slot files on the disk where "
              "it runs; run `kvlab run disk` on that machine")
QUICK_EAGER = ("--quick on a GPU: vLLM in eager mode, as ENFORCE_EAGER=1 (no torch.compile, no "
               "CUDA graphs: starts 30-48% shorter on an H200); ENFORCE_EAGER=0 compiles")


@dataclass(frozen=True)
class AllSpec:
    """The sizes every experiment of the run takes, and which experiments to run."""

    turns: int
    preamble_words: int
    offload_concurrency: int
    levels: tuple[int, ...]
    requests: int | None  # a level's; None: the load generator's max(10 x c, 200)
    max_tokens: int
    preamble_tokens: int
    disk_prompt_tokens: int
    prompt_set: str = "shared-prefix"
    only: tuple[str, ...] = ()
    capacity: CapacityAsk | None = None  # the target "" is the platform's
    llama_slot_ctx: int = 2048  # llama-tiers' pressure runs: tokens per slot
    together: bool = False  # on a GPU: an experiment's engines start at once (`together.py`)

    @classmethod
    def lab(cls, levels: tuple[int, ...], requests: int | None, max_tokens: int,
            preamble_tokens: int, preamble_words: int, prompt_set: str,
            only: tuple[str, ...] = (), gpu: bool = False) -> AllSpec:
        return cls(6, preamble_words, 8, levels, requests, max_tokens, preamble_tokens, 3500,
                   prompt_set, only, CapacityAsk("", LAB_SEARCH), together=gpu)

    @classmethod
    def quick(cls, prompt_set: str, only: tuple[str, ...] = (), gpu: bool = False) -> AllSpec:
        # a GPU serves a pressure run's turns fast: pacing 2 users in flight stretched its
        # think time to 8.1 s and each run to 88 s on the H200, 8 keep it near 20 s
        return cls(3, 400, 8 if gpu else 2, (1, 2), 4, 8, 300, 3000, prompt_set, only,
                   CapacityAsk("", QUICK_SEARCH), llama_slot_ctx=1024, together=gpu)


def quick_settings(loaded: LoadedSettings, quick: bool) -> tuple[Settings, str]:
    """The settings a run all takes, and a note when --quick changed them: on a GPU, vLLM
    eager unless ENFORCE_EAGER was set (on the H200, 8B starts of 98, 65 and 53 s against
    140, 126 and 96 s compiled, in the same pass)."""
    if quick and loaded.profile in GPU_PROFILES and loaded.unset("enforce_eager") \
            and not loaded.values.enforce_eager:
        return loaded.values.model_copy(update={"enforce_eager": True}), QUICK_EAGER
    return loaded.values, ""


def _disagg_parts(lab: Lab) -> tuple[str, ...]:
    """The load and the procedures; the load alone on several prefills or decodes (XpYd),
    where the procedures do not run."""
    return DISAGG_PARTS if lab.placement.counts() == (1, 1) else DISAGG_PARTS[:1]


def specs(lab: Lab, spec: AllSpec) -> dict[str, object]:
    """Each experiment's own spec, at this run's sizes."""
    from kvlab.experiments.disagg import DisaggSpec
    from kvlab.experiments.llama_disk import DiskSpec
    from kvlab.experiments.llama_interference import InterferenceSpec
    from kvlab.experiments.llama_slot_share import SharedSlotsSpec
    from kvlab.experiments.llama_tiers import LlamaTiersSpec
    from kvlab.experiments.mlx_cache import MlxCacheSpec
    from kvlab.experiments.offload import OffloadSpec
    from kvlab.experiments.replicas import ReplicasSpec
    from kvlab.experiments.shared import SharedSpec

    return {
        "disk": DiskSpec(prompt_tokens=spec.disk_prompt_tokens),
        "mlx-cache": MlxCacheSpec(prompt_tokens=min(2000, spec.disk_prompt_tokens),
                                  turns=spec.turns, preamble_words=min(400, spec.preamble_words)),
        "shared-slots": SharedSlotsSpec(prompt_tokens=min(2000, spec.disk_prompt_tokens)),
        # distinct prompts: a shared preamble would let one slot reuse it and hide interference
        "interference": InterferenceSpec(requests=max(spec.requests, 8) if spec.requests
                                         else None,
                                         max_tokens=spec.max_tokens, prompt_set="mixed",
                                         ctx=lab.settings.ctx),
        "llama-tiers": LlamaTiersSpec(turns=spec.turns, preamble_words=spec.preamble_words,
                                      slot_ctx=spec.llama_slot_ctx,
                                      quant_ctx=2 * spec.llama_slot_ctx,
                                      quant_prompt_tokens=spec.llama_slot_ctx // 2),
        "offload": OffloadSpec(turns=spec.turns, preamble_words=spec.preamble_words,
                               concurrency=spec.offload_concurrency,
                               load_max_tokens=spec.max_tokens,
                               preamble_tokens=spec.preamble_tokens, capacity=spec.capacity,
                               together=spec.together),
        "shared": SharedSpec(turns=spec.turns, preamble_words=spec.preamble_words,
                             proof_preamble_words=min(600, spec.preamble_words)),
        "disagg": DisaggSpec(levels=spec.levels, requests=spec.requests,
                             max_tokens=spec.max_tokens, preamble_tokens=spec.preamble_tokens,
                             prompt_set=spec.prompt_set, parts=_disagg_parts(lab),
                             capacity=spec.capacity, together=spec.together),
        # three small replicas: every arm, both prompt sets, a few requests each
        "replicas": ReplicasSpec(replicas=3, requests=max(8, min(spec.requests or 24, 24)),
                                 concurrency=2, preamble_tokens=spec.preamble_tokens,
                                 max_tokens=spec.max_tokens),
    }


def planned(spec: AllSpec) -> list[str]:
    """The experiments the run takes, in order."""
    return [name for name in RUN_ALL if not spec.only or name in spec.only]


async def run(lab: Lab, spec: AllSpec, after: Done = None) -> list[Record]:
    """Run every (or each named) experiment; failures are recorded, not fatal to the rest.
    `after` is told, after each experiment, which have not run yet.

    `lab.outcomes` gets each experiment's {"ok", "lines"} or {"ok": False, "error"}.
    """
    written: list[Record] = []
    order = planned(spec)
    for i, name in enumerate(order):
        written += await _one(lab, spec, name)
        if after is not None:
            after(order[i + 1:])
    return written


async def _one(lab: Lab, spec: AllSpec, name: str) -> list[Record]:
    """One experiment of the run, or the not-run lines that say why it could not run."""
    lab.say(f"\n######## {name}")
    entry = EXPERIMENTS[name]
    why = _unwanted(lab, name) or _prepared(lab, name) or not_here(lab, name)
    if why is not None:
        lab.outcomes[name] = {"ok": True, "lines": 0, "not_run": why}
        return [lab.not_run(r, why) for r in entry.rows]
    try:
        lines = await entry.load().run(lab, specs(lab, spec)[name])
    except KvlabError as exc:
        lab.say(f"    {name} failed: {exc}")
        lab.outcomes[name] = {"ok": False, "error": str(exc)}
        return [lab.not_run(r, f"the {name} experiment failed: {exc}") for r in entry.rows]
    lab.outcomes[name] = {"ok": True, "lines": len(lines)}
    return list(lines)


def _engines(name: str) -> list[str]:
    """The engines experiment `name` starts (its needs but the router)."""
    return [n for n in EXPERIMENTS[name].needs if n in NAMES]


def _unwanted(lab: Lab, name: str) -> str | None:
    """Why preparing experiment `name`'s engines would be wasted: a slot experiment placed on
    a Ray node, or an engine (llama-server: minutes to build with CUDA) with no model of its
    format to serve."""
    if lab.placement.remote and name in SLOT_FILES_HERE:
        return NOT_PLACED
    for engine in _engines(name):
        if (lacking := engine_for(engine).missing(lab.settings)) is not None:
            install = lab.install(engine)
            return lacking if install.found else f"{lacking}; and {install.reason}"
    return None


def _prepared(lab: Lab, name: str) -> str | None:
    """Install what experiment `name`'s engines need (once a run: a failed install is not
    retried by the next experiment that needs it); why it could not be, else None."""
    failed = lab.install_failures
    needs = tuple(n for n in EXPERIMENTS[name].needs if n not in failed)
    try:
        prepare_engines(lab.settings, needs, lab.say)
    except KvlabError as exc:
        failed.update(dict.fromkeys(needs, str(exc)))
    return next((failed[n] for n in EXPERIMENTS[name].needs if n in failed), None)


def not_here(lab: Lab, name: str) -> str | None:
    """Why experiment `name` cannot run on this machine (None: it can)."""
    for engine in _engines(name):
        install = lab.install(engine)
        if not install.found:
            return install.reason
        if (lacking := engine_for(engine).missing(lab.settings)) is not None:
            return lacking
    return None


def run_all(settings: Settings, spec: AllSpec, placement: Placement = LOCAL,
            say: Say = quiet, after: Done = None) -> Lab:
    """`kvlab run all`'s experiments in one lab (its placement open throughout); the lab,
    with each experiment's outcome. `after` is called after each experiment with those not
    run yet (the CLI writes the report so far)."""
    lab = Lab(settings, say=say, placement=placement, pool=EnginePool())
    say(f"==> kvlab run all (run {lab.run_id}, notebook {settings.labbook})")

    async def go() -> None:
        try:
            async with lab.placed():
                await run(lab, spec, after)
        finally:
            if lab.pool is not None:
                await asyncio.shield(lab.pool.close())

    asyncio.run(go())
    return lab
