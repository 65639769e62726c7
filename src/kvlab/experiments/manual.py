"""The measurements a person points at engines kvlab did not start, as library calls: the
seed's measure-reuse.py (`reuse`), Part 9's load-test.py (`load`, and its capacity search),
run-load.sh (`run_load`), compare-disagg.py (`compare`), and kvlab's `prove` and `predict`.

Each runs, appends its lines to LABBOOK as they are measured (a load level's row as the level
ends, so a stopped run keeps what it measured), unless asked to print only, and returns what
it wrote for the caller to render. The commands in `cli/` parse, call one of these, render.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path

from kvlab.core import InputError, Say, SettingError, Settings, quiet
from kvlab.experiments.repeats import one_side
from kvlab.loadgen import (
    CapacityResult,
    Knob,
    LatencyTarget,
    LinkSpec,
    LoadSpec,
    ProgressHook,
    SearchPlan,
    SweepResult,
    fit,
    run_sweep,
    search,
    served,
)
from kvlab.loadgen import run_load as link_run
from kvlab.measure import (
    ProofRun,
    ProveOptions,
    ReuseOptions,
    ReuseRun,
    compat,
    kvmath,
    proof_record,
    reuse_record,
    run_proof,
    run_reuse,
)
from kvlab.measure import compare as pairing
from kvlab.records import (
    BASELINE,
    LAB_OFFLOAD,
    LAB_PD,
    PRESSURE_OFF,
    PRESSURE_ON,
    SPLIT,
    LinkRecord,
    PredictionRecord,
    ProofRecord,
    ReuseRecord,
    notebook,
)


@dataclass(frozen=True)
class Note:
    """How a manual measurement is labelled, and whether it is written at all."""

    label: str
    lab: str
    note: str = ""
    write: bool = True


async def reuse(settings: Settings, opts: ReuseOptions, note: Note,
                ignore: tuple[str, ...] = (), say: Say = quiet) -> tuple[ReuseRun, ReuseRecord]:
    """A growing conversation turn by turn (two endpoints: checked to agree first)."""
    if len(opts.urls) > 1:
        await compat.check(list(opts.urls), ignore=ignore, model=opts.model)
        say("    instances agree (kvlab check); turns alternate between them")
    run = await run_reuse(opts, say=say)
    record = reuse_record(run, note.label, note.lab, note.note)
    if note.write:
        notebook.append(settings.labbook, record)
    return run, record


async def proof(settings: Settings, opts: ProveOptions, note: Note,
                say: Say = quiet) -> tuple[ProofRun, ProofRecord]:
    """Cold, identical, changed-prefix control (and a shared store's cases)."""
    run = await run_proof(opts, say=say)
    record = proof_record(run, note.label, note.lab, note.note)
    if note.write:
        notebook.append(settings.labbook, record)
    return run, record


def predict(settings: Settings, result: kvmath.Prediction, note: Note) -> PredictionRecord:
    """The P/D lab's prediction, as a line (written when `note.write`)."""
    line = PredictionRecord(label=note.label, lab=LAB_PD, note=note.note).overlay(result)
    if note.write:
        notebook.append(settings.labbook, line)
    return line


async def served_spec(settings: Settings, spec: LoadSpec, say: Say = quiet) -> LoadSpec:
    """`spec` with the model name the server lists (`loadgen/served.py`), said when changed,
    and its prompts' sizes said and fitted to the served context (`loadgen/fit.py`): the load
    commands call it once, before the load and its plan line."""
    spec, why = await served.resolve(spec, settings.api_key())
    if why:
        say(f"    {why}")
    return await fit.fit(spec, settings.api_key(), say)


async def load(settings: Settings, spec: LoadSpec, *, stop: asyncio.Event | None = None,
               progress: ProgressHook | None = None) -> SweepResult:
    """Every level of `spec`, each row appended as its level ends."""
    return await run_sweep(spec, api_key=settings.api_key(), stop=stop, progress=progress,
                           on_row=lambda row: notebook.append(settings.labbook, row))


async def capacity(settings: Settings, spec: LoadSpec, target: LatencyTarget, knob: Knob,
                   plan: SearchPlan, *, stop: asyncio.Event | None = None,
                   say: Say = quiet) -> CapacityResult:
    """The highest load that meets `target`: every probe's row, then the capacity line."""
    found = await search(spec, target, knob, plan, api_key=settings.api_key(), stop=stop,
                         on_row=lambda row: notebook.append(settings.labbook, row), say=say)
    notebook.append(settings.labbook, found.record)
    return found


async def run_load(settings: Settings, spec: LoadSpec, link: LinkSpec, repeat: int = 1, *,
                   stop: asyncio.Event | None = None, progress: ProgressHook | None = None,
                   ) -> list[tuple[LinkRecord, SweepResult | None]]:
    """run-load.sh: each repeat's sweep with the link's counters around it (its rows and its
    link line appended); stops after a repeat that was interrupted."""
    if repeat > 1 and link.load_test:
        raise SettingError("--repeat: LOAD_TEST's script numbers no repeats; leave LOAD_TEST "
                           "empty to repeat with kvlab's generator")
    if repeat > 1:  # the repeats of one invocation: compare pools them by this id
        spec = replace(spec, run_id=time.strftime("%Y%m%d-%H%M%S"))
    results: list[tuple[LinkRecord, SweepResult | None]] = []
    for number in one_side(repeat):
        got = await link_run(replace(spec, repeat=number), link, settings.labbook,
                             lambda line: notebook.append(settings.labbook, line),
                             api_key=settings.api_key(), stop=stop, progress=progress)
        results.append(got)
        if got[1] is not None and got[1].interrupted:
            break
    return results


@dataclass(frozen=True)
class Pair:
    """Which two labels a comparison pairs, and what it is told about the KV."""

    disagg: str | None = None
    baseline: str | None = None
    offload: bool = False
    kv_bytes_per_token: float | None = None
    model_config: Path | None = None
    kv_dtype: str | None = None
    prompt_tokens: float | None = None
    ignore_args: tuple[str, ...] = ()


def compare(settings: Settings, pair: Pair, note: Note) -> pairing.Comparison:
    """compare-disagg.py plus kvlab's checks: the lines to print and the record (appended
    when `note.write`)."""
    if pair.kv_bytes_per_token and pair.model_config:
        raise InputError("give --kv-bytes-per-token or --model-config, not both")
    per_token = pair.kv_bytes_per_token or (
        kvmath.load_shape(pair.model_config).bytes_per_token(pair.kv_dtype)
        if pair.model_config else None)
    records = pairing.read_records(settings.labbook)
    result = pairing.compare_runs(
        records, settings.labbook,
        pair.disagg or (PRESSURE_ON.label if pair.offload else SPLIT.label),
        pair.baseline or (PRESSURE_OFF.label if pair.offload else BASELINE.label),
        kv_bytes_per_token=per_token, prompt_tokens=pair.prompt_tokens, note=note.note,
        lab=note.lab or (LAB_OFFLOAD if pair.offload else LAB_PD), offload=pair.offload,
        ignore_args=pair.ignore_args)
    if note.write:
        notebook.append(settings.labbook, result.record)
    return result
