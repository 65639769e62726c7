"""`kvlab plan`: how many replicas, which routing, how much host tier, for a workload, from a
simulation of one measured replica profile (`kvlab.plan`)."""

from __future__ import annotations

import click

from kvlab.cli.common import Output, json_option
from kvlab.cli.options import arguments
from kvlab.plan.args import PlanArgs


@click.command("plan")
@arguments(PlanArgs)
@json_option
def plan_command(args: PlanArgs, as_json: bool) -> None:
    """Predict hit share, TTFT and TPOT for N replicas x routing x tier size."""
    from kvlab.plan.run import measure_from, plan_from
    from kvlab.report import console_plan

    out = Output(as_json)
    if args.measure:
        measured = measure_from(args)
        out.result(measured, lambda console: console.print(
            f"replica profile of {measured.url}: {measured.profile.model_dump_json()}"))
        return
    record = plan_from(args, say=lambda text: out.err.print(f"  {text}"))
    out.result(record, lambda console: console_plan.plan_tables(console, record))


COMMANDS = (plan_command,)
