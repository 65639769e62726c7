"""`kvlab run all`: every experiment this machine can run, then the report.

Order (the registry's `RUN_ALL`): the llama.cpp tiers first (a minute or two), then the vLLM
experiments (offload, shared store, prefill/decode). Each experiment installs what its engines
need (`engines/prepare.py`: for this machine's device, never the CPU's on a GPU; the time its
installs and builds take is said and kept apart from the pass's, `Lab.install_s`) and starts
its own engines; an engine whose plan is the previous step's is kept instead of restarted,
its prefix cache reset and the reset checked (`engines/reuse.py`). One that fails (an engine
that dies, a refused configuration) is recorded as a `not-run` line for each of its report
rows, with the error, everything it started is stopped, and the rest still run. Sizes:
`AllSpec.lab()` are the labs' own; `AllSpec.quick()` are for CI and a first look
(`sizes.py`), each experiment making its own spec from them (`all_spec`). Both search
the capacity at the platform's latency target (the offload lab's users with the tier off, and
on where it runs; the P/D lab's request rate, baseline and split): a few probes of a few
seconds in `quick()`, more and longer in `lab()`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass

from kvlab.cluster.placement import LOCAL, Placement
from kvlab.core import GPU_PROFILES, KvlabError, LoadedSettings, Say, Settings, quiet
from kvlab.engines import EnginePool, engine_for, prepare_engines
from kvlab.experiments import EXPERIMENTS, RUN_ALL, history
from kvlab.experiments.lab import Lab, dry_lab
from kvlab.experiments.sizes import AllSpec
from kvlab.records import Record

Done = Callable[[list[str]], None] | None  # told the experiments not run yet
INSTALL_SAID_S = 1.0  # installs that take longer are said (checking what is there is quicker)


NOT_PLACED = ("not placed on a Ray node: kvlab times llama.cpp's slot files on the disk where "
              "it runs; run `kvlab run disk` on that machine")
QUICK_EAGER = ("--quick on a GPU: vLLM in eager mode, as ENFORCE_EAGER=1 (no torch.compile, no "
               "CUDA graphs: starts 30-48% shorter on an H200); ENFORCE_EAGER=0 compiles")


def quick_settings(loaded: LoadedSettings, quick: bool) -> tuple[Settings, str]:
    """The settings a run all takes, and a note when --quick changed them: on a GPU, vLLM
    eager unless ENFORCE_EAGER was set (on the H200, 8B starts of 98, 65 and 53 s against
    140, 126 and 96 s compiled, in the same pass)."""
    if quick and loaded.profile in GPU_PROFILES and loaded.unset("enforce_eager") \
            and not loaded.values.enforce_eager:
        return loaded.values.model_copy(update={"enforce_eager": True}), QUICK_EAGER
    return loaded.values, ""


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
    began = time.monotonic()
    for i, name in enumerate(order):
        elapsed = time.monotonic() - began - lab.install_s  # installs are not the pass's
        lab.say(f"\n######## {name} {progress(lab, order, i, elapsed)}")
        written += await _one(lab, spec, name)
        if after is not None:
            after(order[i + 1:])
    return written


def progress(lab: Lab, order: list[str], i: int, elapsed_s: float) -> str:
    """`(3 of 9, 4 min 12 s in; about 6 min 40 s for the 7 still to run, by this notebook's
    last runs of 5 of them)`:
    where the pass is, and what the experiments still to run took when they last ran."""
    book = lab.settings.labbook
    read = history.read_lines(book)
    left = [history.took(book, EXPERIMENTS[n].rows, read) for n in order[i:]]
    known = [t.seconds for t in left if t is not None]
    estimate = (f"; about {_minutes(sum(known))} for the {len(left)} still to run, by this "
                f"notebook's last runs of {len(known)} of them" if known else "")
    return f"({i + 1} of {len(order)}, {_minutes(elapsed_s)} in{estimate})"


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


async def _one(lab: Lab, spec: AllSpec, name: str) -> list[Record]:
    """One experiment of the run, or the not-run lines that say why it could not run."""
    entry = EXPERIMENTS[name]
    why = _unwanted(lab, name) or _prepared(lab, name) or not_here(lab, name)
    if why is not None:
        lab.outcomes[name] = {"ok": True, "lines": 0, "not_run": why}
        return [lab.not_run(r, why) for r in entry.rows]
    try:
        module = entry.load()
        lines = await module.run(lab, module.all_spec(lab, spec))
    except KvlabError as exc:
        lab.say(f"    {name} failed: {exc}")
        lab.outcomes[name] = {"ok": False, "error": str(exc)}
        return [lab.not_run(r, f"the {name} experiment failed: {exc}") for r in entry.rows]
    lab.outcomes[name] = {"ok": True, "lines": len(lines)}
    return list(lines)


def _unwanted(lab: Lab, name: str) -> str | None:
    """Why preparing experiment `name`'s engines would be wasted: a slot experiment placed on
    a Ray node, or an engine (llama-server: minutes to build with CUDA) with no model of its
    format to serve."""
    if lab.placement.remote and EXPERIMENTS[name].here:
        return NOT_PLACED
    for engine in EXPERIMENTS[name].engines:
        if (lacking := engine_for(engine).missing(lab.settings)) is not None:
            install = lab.install(engine)
            return lacking if install.found else f"{lacking}; and {install.reason}"
    return None


def _prepared(lab: Lab, name: str) -> str | None:
    """Install what experiment `name`'s engines need (once a run: a failed install is not
    retried by the next experiment that needs it); why it could not be, else None."""
    failed = lab.install_failures
    needs = tuple(n for n in EXPERIMENTS[name].needs if n not in failed)
    started = time.monotonic()
    try:
        prepare_engines(lab.settings, needs, lab.say)
    except KvlabError as exc:
        failed.update(dict.fromkeys(needs, str(exc)))
    took = time.monotonic() - started
    lab.install_s += took
    if took >= INSTALL_SAID_S:  # a build, a download, a GGUF made: said, and kept apart
        lab.say(f"    installs for {name}: {took:.0f} s (install time, not the pass's: "
                f"{lab.install_s:.0f} s so far)")
    return next((failed[n] for n in EXPERIMENTS[name].needs if n in failed), None)


def not_here(lab: Lab, name: str) -> str | None:
    """Why experiment `name` cannot run on this machine (None: it can)."""
    for engine in EXPERIMENTS[name].engines:
        install = lab.install(engine)
        if not install.found:
            return install.reason
        if (lacking := engine_for(engine).missing(lab.settings)) is not None:
            return lacking
    return None


def dry_run(settings: Settings, spec: AllSpec, placement: Placement = LOCAL,
            say: Say = quiet) -> list[dict[str, object]]:
    """What `kvlab run all` would do, experiment by experiment, installing, starting and
    writing nothing: its rows, engines (found or what installs them), sizes, plans (where it
    has them ahead of a run), whether it would be skipped and why, and how long it took when
    it last ran here."""
    lab = dry_lab(settings, placement, say)
    out: list[dict[str, object]] = []
    for name in planned(spec):
        entry = EXPERIMENTS[name]
        module = entry.load()
        own = module.all_spec(lab, spec)
        installs = {e: lab.install(e) for e in entry.engines}
        took = history.took(settings.labbook, entry.rows)
        out.append({
            "experiment": name, "rows": [r.title for r in entry.rows],
            "engines": {e: i.as_record().model_dump() | {"found": i.found}
                        for e, i in installs.items()},
            "sizes": asdict(own) if is_dataclass(own) and not isinstance(own, type) else {},
            "skipped": _unwanted(lab, name) or _lacking(lab, name),
            "installs_first": [e for e, i in installs.items() if not i.found],
            "plans": module.dry_run(lab, own) if entry.shows_plans and not
            any(not i.found for i in installs.values()) else [],
            "last_took": took.words() if took else "no earlier run in the notebook"})
    return out


def _lacking(lab: Lab, name: str) -> str | None:
    """What an installed engine of experiment `name` lacks to run it (a model of its format):
    an engine not installed yet is installed first by the run (where kvlab builds one for this
    machine; where it cannot, its rows say why)."""
    return next((lacking for e in EXPERIMENTS[name].engines
                 if (lacking := engine_for(e).missing(lab.settings)) is not None), None)


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
