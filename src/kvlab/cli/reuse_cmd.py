"""`kvlab reuse` (the seed's measure-reuse.py), `kvlab prove`, `kvlab check`.

Exit codes: 0 when every verdict is what it should be; 1 when `reuse` or `prove` found no
reuse where reuse was expected (`silent-miss`, `warm-up-only`: the record is written and the
result printed first); 2 for a user error, and for `check` refusing instances that disagree
(with `--json`, its one document is printed first, `"compatible": false` and each mismatch).
"""

from __future__ import annotations

import asyncio

import click

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.cli.options import arguments
from kvlab.core import InputError, RefusedError
from kvlab.experiments.manual_args import ProveArgs, ReuseArgs
from kvlab.measure import FAILED

ignore_option = click.option(
    "--ignore", multiple=True,
    help="A compatibility field not to compare (repeatable), e.g. fingerprint or kv_store.")


@click.command("reuse")
@arguments(ReuseArgs)
@json_option
@click.pass_context
def reuse_command(ctx: click.Context, args: ReuseArgs, as_json: bool) -> None:
    """Time a growing conversation turn by turn and read the engines' reuse counters."""
    from kvlab.experiments import manual
    from kvlab.report import console_reuse

    settings = settings_from(ctx, labbook=args.labbook).values
    out = Output(as_json)
    opts = args.options(settings)
    out.note(f"==> {args.label}: {opts.model}, {args.turns} turns, preamble about "
             f"{args.preamble_words} words, max_tokens {args.max_tokens}")
    run, record = asyncio.run(manual.reuse(settings, opts, args.noted(args.label), args.ignore,
                                           out.note))
    written = None if args.print_only else settings.labbook
    out.result(record, lambda c: console_reuse.reuse(c, record, written))
    _exit_on_failed(ctx, out, [f"turn {r.turn}" for r in run.rows if r.verdict in FAILED])


@click.command("prove")
@arguments(ProveArgs)
@json_option
@click.pass_context
def prove_command(ctx: click.Context, args: ProveArgs, as_json: bool) -> None:
    """Prove reuse with a cold request, an identical repeat and a changed-prefix control."""
    from kvlab.experiments import manual
    from kvlab.report import console_reuse

    settings = settings_from(ctx, labbook=args.labbook).values
    out = Output(as_json)
    opts = args.options(settings)
    out.note(f"==> proving reuse on {', '.join(opts.urls)}")
    run, record = asyncio.run(manual.proof(settings, opts, args.noted(args.label), out.note))
    out.result(record, lambda c: console_reuse.proof(c, record))
    _exit_on_failed(ctx, out, run.failed())


def _exit_on_failed(ctx: click.Context, out: Output, failed: list[str]) -> None:
    """Exit 1, naming them, where a step showed no reuse where reuse was expected."""
    if failed:
        out.err.print(f"kvlab: no reuse where reuse was expected ({', '.join(failed)}): exit 1")
        ctx.exit(1)


@click.command("check")
@click.argument("urls", nargs=-1, required=True)
@ignore_option
@click.option("--model", default=None, help="The model name clients send: the fingerprint's "
              "probe goes under it (default: the one name every instance lists).")
@json_option
def check_command(urls: tuple[str, ...], ignore: tuple[str, ...], model: str | None,
                  as_json: bool) -> None:
    """Refuse instances that disagree: model, version, context, block size, chat-template
    tokens, model content, dtype, quantisation, KV type, numerics flags, store, adapters
    (LoRA), and the behavioural fingerprint (the same probe's top-k logprobs, under the name
    clients send). A different model path is a
    note. Exit 2 when refused; --json prints its document either way."""
    from kvlab.measure import compat
    from kvlab.report import console_reuse

    if len(urls) < 2:
        raise InputError("check needs at least two URLs to compare")
    unknown = sorted(set(ignore) - set(compat.FIELDS))
    if unknown:
        raise InputError(f"--ignore {unknown[0]}: not a compared field; choose from "
                         + ", ".join(compat.FIELDS))
    result = asyncio.run(compat.compare(list(urls), ignore=ignore, model=model))
    Output(as_json).result(result.as_dict(), lambda c: console_reuse.compatibility(c, result))
    if not result.compatible:
        raise RefusedError(result.refusal())


COMMANDS = (reuse_command, prove_command, check_command)
