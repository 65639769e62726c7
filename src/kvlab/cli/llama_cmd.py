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
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from

if TYPE_CHECKING:
    from kvlab.core.settings import Settings
    from kvlab.engines.llamacpp.client import LlamaClient
    from kvlab.engines.llamacpp.slotstore import SlotStore
    from kvlab.engines.plan import EnginePlan

_EXPLAIN = """\
    What the tiers are, per the llama-server README:
      --cache-prompt     per-slot prompt caching (on by default; passed so the run says so)
      --parallel         slots: conversations that can stay warm at the same time; each slot
                         holds CTX / parallel tokens
      -ctk / -ctv        the KV cache's data type; q8_0 halves it against f16 but, unlike
                         prompt caching, changes outputs: never compare it with an f16 run
      --slot-save-path   where slot save writes and restore reads (the disk tier); without
                         it both endpoints are off
      --metrics --slots  the two endpoints kvlab reads
    --cache-reuse (reuse through KV shifting) is left off, as in the lab.
"""

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
    from kvlab.engines.llamacpp.client import write_serve_record
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
                   lambda console: _summary(console, plan))
        return
    binary = llamacpp.require_llama_server(settings)
    plan = llamacpp.plan(settings, binary, opts).with_secrets(settings.known_secrets())
    llamacpp.check_plan_flags(plan, llamacpp.help_flags(binary))
    _summary(out.err if as_json else out.console, plan)
    record = write_serve_record(settings, plan, serve_log(settings, plan))
    served = None
    try:
        served = asyncio.run(serve_here(settings, plan, detach=detach))
    finally:
        if served is None or served.pid is None:  # a detached server keeps its record
            record.unlink(missing_ok=True)
    serve_cmd.finish(ctx, out, served)


def _summary(console: Console, plan: EnginePlan) -> None:
    from kvlab.cli import serve_cmd

    serve_cmd.print_summary(console, plan)
    console.print(_EXPLAIN)


def _client(ctx: click.Context, port: int | None) -> tuple[Settings, LlamaClient, SlotStore]:
    """(settings, client, store) for the server at LLAMA_PORT or --port."""
    from kvlab.engines.llamacpp.client import LlamaClient, target_from_settings
    from kvlab.engines.llamacpp.slotstore import SlotStore

    settings = settings_from(ctx, llama_port=port).values
    target = target_from_settings(settings, port)
    return settings, LlamaClient(target, settings.api_key()), SlotStore(target.slot_dir)


@llama_group.command("slots")
@port_option
@json_option
@click.pass_context
def slots(ctx: click.Context, port: int | None, as_json: bool) -> None:
    """Show what each slot holds, and the slot files saved in the store."""
    _, client, store = _client(ctx, port)

    async def go() -> list[dict[str, Any]]:
        async with client:
            return await client.slots()

    state = asyncio.run(go())
    files = [{"filename": e.filename, "bytes": e.bytes,
              "manifest": asdict(e.manifest) if e.manifest else None} for e in store.entries()]
    data = {"base_url": client.target.base_url, "slots": state,
            "store": str(store.directory), "files": files}
    out = Output(as_json)
    out.result(data, lambda console: _render_slots(console, data))


def _render_slots(console: Console, data: dict[str, Any]) -> None:
    console.print(f"==> What each slot of {data['base_url']} is holding")
    for s in data["slots"]:
        busy = "busy" if s.get("is_processing") else "idle"
        console.print(f"    slot {s.get('id')}: {busy}, {_holds(s)} of {s.get('n_ctx')}")
    console.print(f"==> Slot files in {data['store']}")
    if not data["files"]:
        console.print("    (none)")
    for f in data["files"]:
        m = f["manifest"]
        about = (f"{m['n_tokens']} tokens, {m['kv_type_k']}/{m['kv_type_v']}, --parallel "
                 f"{m['parallel']}, model {m['model_sha256'][:12]}…, saved {m['saved_at']}"
                 if m else "no kvlab manifest: kvlab will not restore it")
        console.print(f"    {f['filename']}  {f['bytes']:,} B  {about}")


def _holds(slot: dict[str, Any]) -> str:
    """What a slot holds, as far as /slots says: this llama-server lists a slot's token count
    only once the slot has served a request, so a slot that was only restored into lists none
    (and is not empty)."""
    from kvlab.engines.llamacpp.facts import SLOT_PROMPT_TOKENS

    held = slot.get(SLOT_PROMPT_TOKENS)
    if held is None:
        return ("prompt tokens not reported (the server counts a slot's tokens only once it has "
                "served a request; a slot restored from a file is not counted)")
    return f"holds {held} prompt tokens"


def _report(console: Console, data: dict[str, Any]) -> None:
    console.print(f"==> {data['action']} slot {data['slot']}"
                  + (f" as {data['filename']}" if data.get("filename") else ""))
    server = f"{data['server_ms']} ms server-side, " if data.get("server_ms") is not None else ""
    size = f", {data['n_bytes']:,} bytes" if data.get("n_bytes") is not None else ""
    console.print(f"    took {server}{data['wall_ms']:.1f} ms wall; {data['n_tokens']} "
                  f"tokens{size}")
    if data["action"] in ("save", "restore"):
        console.print("    That is the disk tier's latency for this conversation. Compare it "
                      "with the\n    time the same prompt takes to prefill from cold "
                      "(`kvlab run disk` does both).")


@llama_group.command("save")
@click.argument("slot", type=int)
@click.argument("filename")
@port_option
@json_option
@click.pass_context
def save(ctx: click.Context, slot: int, filename: str, port: int | None, as_json: bool) -> None:
    """Write SLOT's cache to FILENAME in the store, with its manifest, and time it."""
    from kvlab.engines.llamacpp import slotstore

    settings, client, store = _client(ctx, port)

    async def go() -> dict[str, Any]:
        async with client:
            op, manifest = await slotstore.save(client, store, slot, filename,
                                                settings.paths().file_hashes)
        return {**op.as_dict(), "path": str(store.slot_path(filename)),
                "manifest": asdict(manifest), "config_source": client.target.source}

    data = asyncio.run(go())
    Output(as_json).result(data, lambda console: _report(console, data))


@llama_group.command("restore")
@click.argument("slot", type=int)
@click.argument("filename")
@port_option
@json_option
@click.pass_context
def restore(ctx: click.Context, slot: int, filename: str, port: int | None,
            as_json: bool) -> None:
    """Read FILENAME back into SLOT, after checking its manifest against the server."""
    from kvlab.engines.llamacpp import slotstore

    settings, client, store = _client(ctx, port)

    async def go() -> dict[str, Any]:
        async with client:
            op, manifest = await slotstore.restore(client, store, slot, filename,
                                                   settings.paths().file_hashes)
        return {**op.as_dict(), "manifest": asdict(manifest),
                "config_source": client.target.source}

    data = asyncio.run(go())
    Output(as_json).result(data, lambda console: _report(console, data))


@llama_group.command("erase")
@click.argument("slot", type=int)
@port_option
@json_option
@click.pass_context
def erase(ctx: click.Context, slot: int, port: int | None, as_json: bool) -> None:
    """Discard SLOT's cache (it cannot be undone; `kvlab llama slots` shows what it holds)."""
    _, client, _ = _client(ctx, port)

    async def go() -> dict[str, Any]:
        async with client:
            await client.check_slot(slot)
            return (await client.erase(slot)).as_dict()

    data = asyncio.run(go())
    Output(as_json).result(data, lambda console: _report(console, data))


COMMANDS = (llama_group,)
