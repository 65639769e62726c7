"""`kvlab predict`: the KV arithmetic the P/D lab asks to be written down before any run."""

from __future__ import annotations

import click

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.cli.options import arguments
from kvlab.experiments.manual_args import PredictArgs
from kvlab.records import LAB_PD


@click.command("predict")
@arguments(PredictArgs)
@json_option
@click.pass_context
def predict_command(ctx: click.Context, args: PredictArgs, as_json: bool) -> None:
    """Bytes per token, payload per request, transfer time and maximum concurrency."""
    from kvlab.experiments import manual
    from kvlab.report import console_reuse

    settings = settings_from(ctx, labbook=args.labbook).values
    result = args.predicted(settings)
    data: dict[str, object] = result.model_dump(exclude_none=True)
    if args.record:
        manual.predict(settings, result, manual.Note(args.label, LAB_PD, args.note))
        data["recorded_to"] = settings.labbook
    written = settings.labbook if args.record else None
    Output(as_json).result(data, lambda c: console_reuse.prediction(c, result, written))


COMMANDS = (predict_command,)
