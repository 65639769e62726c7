"""`kvlab run EXPERIMENT`: one orchestrated experiment, its notebook lines, its result.

Each subcommand's options are its arguments model (`experiments/args.py`); the command makes
the experiment's spec from them and the settings, installs what that experiment's engines
need, runs it (`experiments.lab.execute`: the experiment starts and always stops its own
engines and writes every line) and renders what was written (`report/console_run.py`;
the llama.cpp experiments' own in `report/console_llama.py`).
`--dry-run` prints the plans and starts, installs and writes nothing (on a cluster it reads
which nodes the names mean, and prints the placement). The vLLM labs take
`--cluster ADDRESS` (or Ray's RAY_ADDRESS) and `--node NAME`; without either nothing imports
Ray. Progress goes to stderr under `--json`, so stdout stays one JSON document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click
from rich.console import Console

from kvlab.cli.common import (
    Output,
    ensure_prepared,
    json_option,
    prepared_settings,
    settings_from,
    stop_on_sigterm,
)
from kvlab.cli.options import arguments
from kvlab.experiments import registered
from kvlab.experiments.args import (
    AllArgs,
    DisaggArgs,
    DiskArgs,
    InterferenceArgs,
    LlamaTiersArgs,
    MlxCacheArgs,
    OffloadArgs,
    PlannedArgs,
    ReplicasArgs,
    RunArgs,
    SharedArgs,
    SharedSlotsArgs,
)

if TYPE_CHECKING:
    from kvlab.records import Record

Render = Callable[[Console, "list[Record]", str], None]


@click.group("run")
def run_group() -> None:
    """Run one of the labs' experiments end to end and record it in the notebook."""


def _run(ctx: click.Context, name: str, args: RunArgs, as_json: bool,
         render: Render | None = None) -> list[Record]:
    """The experiment `name` from `args` (its plans alone with `--dry-run`), rendered."""
    from kvlab.experiments import lab
    from kvlab.report import console_run

    out = Output(as_json)
    loaded = settings_from(ctx, **args.overrides())
    spec = args.spec(loaded)  # refused now, before anything is installed
    placement = args.placement(loaded.values)
    if isinstance(args, PlannedArgs) and args.dry_run:
        found = [p for p in lab.plans(loaded.values, name, spec, placement, out.note)
                 if _kept(args, p)]
        out.result({"dry_run": True, "plans": found}, lambda c: console_run.plans(c, found))
        return []
    ensure_prepared(loaded, out.err, registered(name).needs)
    lines = lab.execute(loaded.values, name, spec, placement, out.note)
    draw = render or console_run.lines
    out.result({"records": lines}, lambda c: draw(c, lines, loaded.values.labbook))
    return lines


def _kept(args: RunArgs, plan: dict[str, object]) -> bool:
    """`run offload --part`: only the quiet or the pressure pair's plans."""
    if not isinstance(args, OffloadArgs) or args.part not in ("quiet", "pressure"):
        return True
    return str(plan["label"]).endswith("-load") == (args.part == "pressure")


@run_group.command("disk")
@arguments(DiskArgs)
@json_option
@click.pass_context
def disk(ctx: click.Context, args: DiskArgs, as_json: bool) -> None:
    """Time the disk tier: cold prefill, save, erase, control, restore, the prompt again.

    The server is the experiment's own (a free port, these settings, recorded in the line).
    """
    _run(ctx, "disk", args, as_json, _disk_lines)


@run_group.command("interference")
@arguments(InterferenceArgs)
@json_option
@click.pass_context
def interference(ctx: click.Context, args: InterferenceArgs, as_json: bool) -> None:
    """Prefill interference: the same load with --parallel 4, then 1 (one variable)."""
    from kvlab.records import ComparisonRecord, LoadRecord
    from kvlab.report import console_llama

    def draw(c: Console, lines: list[Record], book: str) -> None:
        *rows, comparison = lines
        assert isinstance(comparison, ComparisonRecord)
        console_llama.interference(c, [r for r in rows if isinstance(r, LoadRecord)],
                                   comparison, book)

    _run(ctx, "interference", args, as_json, draw)


@run_group.command("mlx-cache")
@arguments(MlxCacheArgs)
@json_option
@click.pass_context
def mlx_cache(ctx: click.Context, args: MlxCacheArgs, as_json: bool) -> None:
    """Time mlx-lm's prompt-cache file: cold prefill, save, load in a new process, the first
    token from it."""
    _run(ctx, "mlx-cache", args, as_json, _disk_lines)


def _disk_lines(c: Console, lines: list[Record], book: str) -> None:
    """A disk tier's stopwatch as a table of its steps; any other line (mlx-lm's turns) as
    every line is shown."""
    from kvlab.records import DiskRecord
    from kvlab.report import console_llama, console_run

    for line in lines:
        if isinstance(line, DiskRecord):
            console_llama.disk(c, line, book)
        else:
            console_run.lines(c, [line], book)


@run_group.command("llama-tiers")
@arguments(LlamaTiersArgs)
@json_option
@click.pass_context
def llama_tiers(ctx: click.Context, args: LlamaTiersArgs, as_json: bool) -> None:
    """llama.cpp's tasks 2 and 3: prompt caching off/on, the RAM cache under pressure, q8_0
    against f16 KV in the same memory (one llama-server at a time)."""
    _run(ctx, "llama-tiers", args, as_json)


@run_group.command("shared-slots")
@arguments(SharedSlotsArgs)
@json_option
@click.pass_context
def shared_slots(ctx: click.Context, args: SharedSlotsArgs, as_json: bool) -> None:
    """Two llama-servers share one slot store: save on A, restore on B, prove reuse on B."""
    from kvlab.records import ReuseRecord
    from kvlab.report import console_llama

    def draw(c: Console, lines: list[Record], book: str) -> None:
        assert isinstance(lines[-1], ReuseRecord)
        console_llama.shared_slots(c, lines[-1], book)

    _run(ctx, "shared-slots", args, as_json, draw)


@run_group.command("offload")
@arguments(OffloadArgs)
@json_option
@click.pass_context
def offload(ctx: click.Context, args: OffloadArgs, as_json: bool) -> None:
    """The host-memory tier: off and on, quiet and under found pressure.

    --part curve: the tier at several sizes against none; --part boundary: tier off and on at
    several opening lengths.
    """
    _run(ctx, "offload-sizes" if args.part in ("curve", "boundary") else "offload", args,
         as_json)


@run_group.command("shared")
@arguments(SharedArgs)
@json_option
@click.pass_context
def shared(ctx: click.Context, args: SharedArgs, as_json: bool) -> None:
    """Two instances, one KV store: alternating turns, a single-instance control, the proof."""
    _run(ctx, "shared", args, as_json)


@run_group.command("replicas")
@arguments(ReplicasArgs)
@json_option
@click.pass_context
def replicas(ctx: click.Context, args: ReplicasArgs, as_json: bool) -> None:
    """N plain replicas behind one front: round-robin, least-outstanding, prefix and
    conversation affinity in kvlab's proxy, and vllm-router's policies, each arm's hit rate,
    TTFT, imbalance and the cache oracle's figures."""
    from kvlab.report import console_run

    def draw(c: Console, lines: list[Record], book: str) -> None:
        console_run.replicas(c, lines)

    _run(ctx, "replicas", args, as_json, draw)


@run_group.command("disagg")
@arguments(DisaggArgs)
@json_option
@click.pass_context
def disagg(ctx: click.Context, args: DisaggArgs, as_json: bool) -> None:
    """Prediction, the split behind kvlab's proxy, the baseline, the comparison; with --part,
    the lab's procedure steps (a cancel and a worker restart; the prompt-length boundary)."""
    from kvlab.records import ProcedureRecord

    lines = _run(ctx, "disagg", args, as_json)
    if any(isinstance(r, ProcedureRecord) and r.verdict == "fail" for r in lines):
        ctx.exit(1)


@run_group.command("all")
@arguments(AllArgs)
@json_option
@click.pass_context
def run_all_command(ctx: click.Context, args: AllArgs, as_json: bool) -> None:
    """Every experiment this machine can run, then `kvlab report` (the README's main command)."""
    from pathlib import Path

    from kvlab.core import KvlabError
    from kvlab.experiments import everything
    from kvlab.report import write

    out = Output(as_json)
    loaded = prepared_settings(ctx, out.err, ())  # the models; each experiment its engines
    out.note(f"profile {loaded.profile}")
    values, changed = everything.quick_settings(loaded, args.quick)
    if changed:
        out.note(changed)
    spec, where = args.spec(loaded), Path(args.report_dir)
    pending = everything.planned(spec)

    def so_far(left: list[str]) -> None:  # a cut run still leaves what it measured
        pending[:] = left
        write(loaded.values.labbook, where, pending=left)
        out.note(f"report so far in {where}/report.html" + (
            f" (not run yet: {', '.join(left)})" if left else ""))

    try:
        with stop_on_sigterm():
            lab = everything.run_all(values, spec, args.placement(values),
                                     out.note, so_far)
    except KeyboardInterrupt:
        write(loaded.values.labbook, where, pending=pending, stopped=True)
        out.note(f"stopped: the report of what ran is in {where}/report.html")
        raise
    report = write(loaded.values.labbook, where)
    text = report.markdown()
    out.result({"run_id": lab.run_id, "experiments": lab.outcomes, "report": report.as_dict()},
               lambda c: c.print(text + f"\n(report written to {args.report_dir}/report.md and "
                                        "report.html)"))
    failed = [name for name, result in lab.outcomes.items() if not result["ok"]]
    if failed:
        raise KvlabError(f"experiment(s) failed: {', '.join(failed)}; their rows say why in "
                         f"{args.report_dir}/report.md")


COMMANDS = (run_group,)
