"""`kvlab llama serve|slots|save|restore|erase`: the seed's `llama-cache-tiers.sh`.

`serve` prints the seed's summary block, checks every flag it passes against the binary's
`--help` (naming a missing one) and runs llama-server in the foreground through `kvlab serve`'s
runner, leaving a record of its KV types and log for the other subcommands. `save` and
`restore` go through the slot store (a manifest beside each file, checked before a restore)
and report the server's own timing and the wall time. Slot ids past the last slot are refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import TYPE_CHECKING

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from kvlab.engines import EnginePlan, llamacpp

port_option = click.option("--port", type=click.IntRange(1, 65535),
                           help="The server's port (default: LLAMA_PORT).")


@click.group("llama")
def llama_group() -> None:
    """llama-server's cache tiers: serve, slots, save, restore, erase."""


@llama_group.command("serve", context_settings={"ignore_unknown_options": True})
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", help="GGUF file (default: LLAMA_MODEL).")
@port_option
@click.option("--parallel", type=click.IntRange(1, 256), help="Slots (default: LLAMA_PARALLEL).")
@click.option("--cache-type", help="KV type for -ctk and -ctv (default: LLAMA_CACHE_TYPE).")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--detach", is_flag=True,
              help="Leave the server running once it is ready (`kvlab clean` stops it).")
@json_option
@click.pass_context
def serve(ctx: click.Context, engine_args: tuple[str, ...], model: str | None, port: int | None,
          parallel: int | None, cache_type: str | None, dry_run: bool, detach: bool,
          as_json: bool) -> None:
    """Start llama-server with its cache tiers in the foreground (Ctrl-C, SIGTERM or SIGHUP
    stops it; kvlab exits with the server's status).

    Arguments after `--` reach llama-server unchanged (secrets among them shown redacted).
    """
    from kvlab.cli import serve_cmd
    from kvlab.engines import llamacpp
    from kvlab.experiments.serve import serve_here, serve_log

    loaded = settings_from(ctx, llama_port=port, llama_parallel=parallel,
                           llama_cache_type=cache_type)
    settings = loaded.values
    opts = llamacpp.LlamaOptions(model=model, extra_args=engine_args)
    out = Output(as_json)
    if dry_run:
        found = llamacpp.find_llama_server(settings) or "llama-server"
        plan = llamacpp.plan(settings, found, opts).with_secrets(settings.known_secrets())
        out.result({"plan": plan.as_dict(), "dry_run": True},
                   lambda shown: _summary(shown, plan))
        return
    binary = llamacpp.require_llama_server(settings)
    plan = llamacpp.plan(settings, binary, opts).with_secrets(settings.known_secrets())
    llamacpp.check_plan_flags(plan, llamacpp.help_flags(binary))
    _summary(out.err if as_json else out.console, plan)
    record = llamacpp.write_serve_record(settings, plan, serve_log(settings, plan))
    served = None
    try:
        served = asyncio.run(serve_here(settings, plan, detach=detach))
    finally:
        if served is None or served.pid is None:  # a detached server keeps its record
            record.unlink(missing_ok=True)
    serve_cmd.finish(ctx, out, served)


def _summary(shown: Console, plan: EnginePlan) -> None:
    from kvlab.report import console_engines

    console_engines.plan(shown, plan)
    shown.print(console_engines.LLAMA_TIERS)


@llama_group.command("slots")
@port_option
@json_option
@click.pass_context
def slots(ctx: click.Context, port: int | None, as_json: bool) -> None:
    """Show what each slot holds, and the slot files saved in the store."""
    from kvlab.engines import llamacpp
    from kvlab.report import console_llama

    found = asyncio.run(llamacpp.slots.held(settings_from(ctx, llama_port=port).values, port))
    Output(as_json).result(asdict(found), lambda c: console_llama.slots(c, found))


@llama_group.command("save")
@click.argument("slot", type=int)
@click.argument("filename")
@port_option
@json_option
@click.pass_context
def save(ctx: click.Context, slot: int, filename: str, port: int | None, as_json: bool) -> None:
    """Write SLOT's cache to FILENAME in the store, with its manifest, and time it."""
    from kvlab.engines import llamacpp

    _slot_action(ctx, port, as_json,
                 lambda settings: llamacpp.slots.save(settings, slot, filename, port))


@llama_group.command("restore")
@click.argument("slot", type=int)
@click.argument("filename")
@port_option
@json_option
@click.pass_context
def restore(ctx: click.Context, slot: int, filename: str, port: int | None,
            as_json: bool) -> None:
    """Read FILENAME back into SLOT, after checking its manifest against the server."""
    from kvlab.engines import llamacpp

    _slot_action(ctx, port, as_json,
                 lambda settings: llamacpp.slots.restore(settings, slot, filename, port))


@llama_group.command("erase")
@click.argument("slot", type=int)
@port_option
@json_option
@click.pass_context
def erase(ctx: click.Context, slot: int, port: int | None, as_json: bool) -> None:
    """Discard SLOT's cache (it cannot be undone; `kvlab llama slots` shows what it holds)."""
    from kvlab.engines import llamacpp

    _slot_action(ctx, port, as_json, lambda settings: llamacpp.slots.erase(settings, slot, port))


def _slot_action(ctx: click.Context, port: int | None, as_json: bool,
                 action: Callable[..., Coroutine[object, object, llamacpp.slots.Done]]
                 ) -> None:
    """Run one slot action (given the settings) against the server on `port` and show what
    it did."""
    from kvlab.report import console_llama

    done = asyncio.run(action(settings_from(ctx, llama_port=port).values))
    Output(as_json).result(_shown(done), lambda c: console_llama.slot_action(c, done))


def _shown(done: llamacpp.slots.Done) -> dict[str, object]:
    """A slot action as `--json` prints it: the server's figures, then the manifest's."""
    out: dict[str, object] = {**done.op.as_dict()}
    if done.manifest is not None:
        out["manifest"] = asdict(done.manifest)
    if done.path is not None:
        out["path"] = done.path
    if done.config_source:
        out["config_source"] = done.config_source
    return out


COMMANDS = (llama_group,)
