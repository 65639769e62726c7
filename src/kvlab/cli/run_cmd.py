"""`kvlab run EXPERIMENT`: one orchestrated experiment, its notebook lines, its result.

Each subcommand's options are its arguments model (`experiments/args.py`); the command makes
the experiment's spec from them and the settings, installs what that experiment's engines
need, runs it (`experiments.execute.execute`: the experiment starts and always stops its own
engines and writes every line) and renders what was written (`report/console_run.py`;
the llama.cpp experiments' own in `report/console_llama.py`).
`--dry-run` prints the plans and starts, installs and writes nothing (on a cluster it reads
which nodes the names mean, and prints the placement). The vLLM labs take
`--cluster ADDRESS` (or Ray's RAY_ADDRESS) and `--node NAME`; without either nothing imports
Ray. Progress goes to stderr under `--json`, so stdout stays one JSON document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kvlab.cli.common import (
    Output,
    ensure_prepared,
    json_option,
    prepared_settings,
    settings_from,
    stop_on_sigterm,
)
from kvlab.cli.options import arguments
from kvlab.experiments import Registered, commands, registered
from kvlab.experiments.all_args import AllArgs
from kvlab.experiments.args import PlannedArgs, RunArgs

if TYPE_CHECKING:
    from kvlab.records import Record


@click.group("run")
def run_group() -> None:
    """Run one of the labs' experiments end to end and record it in the notebook."""


def _run(ctx: click.Context, entry: Registered, args: RunArgs, as_json: bool) -> list[Record]:
    """The experiment `entry` (or the one its arguments pick) from `args`, its plans alone
    with `--dry-run`, rendered by its view."""
    from kvlab.experiments import execute
    from kvlab.report import console_run

    out = Output(as_json)
    loaded = settings_from(ctx, **args.overrides())
    name = args.experiment(entry.name)
    spec = args.spec(loaded)  # refused now, before anything is installed
    placement = args.placement(loaded.values)
    if isinstance(args, PlannedArgs) and args.dry_run:
        found = [p for p in execute.plans(loaded.values, name, spec, placement, out.note)
                 if args.shown(p)]
        out.result({"dry_run": True, "plans": found}, lambda c: console_run.plans(c, found))
        return []
    ensure_prepared(loaded, out.err, registered(name).needs)
    lines = execute.execute(loaded.values, name, spec, placement, out.note)
    view = console_run.VIEWS[entry.view]
    out.result({"records": lines}, lambda c: view(c, lines, loaded.values.labbook))
    return lines


def _command(entry: Registered, model: type[RunArgs]) -> click.Command:
    """`kvlab run NAME`: the options its arguments model declares; exit 1 when a line it
    wrote records a failed check."""
    @click.pass_context
    def command(ctx: click.Context, args: RunArgs, as_json: bool) -> None:
        if any(line.failing() for line in _run(ctx, entry, args, as_json)):
            ctx.exit(1)

    made = arguments(model)(json_option(command))
    return click.command(entry.name, help=model.__doc__)(made)


for _entry in commands():
    assert _entry.args is not None
    run_group.add_command(_command(_entry, _entry.args))


def _dry_run_all(ctx: click.Context, args: AllArgs, out: Output) -> None:
    """`kvlab run all --dry-run`: each experiment's plan; installs, starts, writes nothing."""
    from kvlab.experiments import everything
    from kvlab.report import console_run

    loaded = settings_from(ctx)
    values, changed = everything.quick_settings(loaded, args.quick)
    found = everything.dry_run(values, args.spec(loaded), args.placement(values), out.note)
    out.result({"dry_run": True, "profile": loaded.profile, "changed": changed,
                "experiments": found}, lambda c: console_run.run_all_plans(c, found))


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
    if args.dry_run:
        _dry_run_all(ctx, args, out)
        return
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
