"""`kvlab serve ROLE`: one engine in the foreground, like the seed's serve scripts.

It prints the same configuration summary first, starts the engine, records a `startup` line
(KV cache size, maximum concurrency) once it is ready, and stops it cleanly on Ctrl-C.
`--dry-run` prints the plan and starts nothing; arguments after `--` reach the engine as is.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core.settings import LoadedSettings, Settings
from kvlab.engines import llamacpp, vllm
from kvlab.engines.plan import EnginePlan

ALL_ROLES = (*vllm.ROLES, "llama", "proxy")


def build_plan(loaded: LoadedSettings, role: str, model: str | None, port: int | None,
               extra: tuple[str, ...], *, probe: bool) -> EnginePlan:
    """The plan for `role`, probing vLLM's flags only where the role needs them."""
    settings = loaded.values
    if role == "llama":
        binary = llamacpp.find_llama_server(settings) or "llama-server"
        opts = llamacpp.LlamaOptions(model=model, port=port, extra_args=extra)
        return llamacpp.plan(settings, binary, opts)
    install = vllm.find_vllm(settings)
    if probe:
        vllm.require_found(install)
    flags = None
    if probe and role == "offload" and settings.offload:
        flags = vllm.accepted_flags(install, settings.paths().flag_probes)
    opts_v = vllm.PlanOptions(model=model, port=port, extra_args=extra)
    return vllm.plan(settings, role, install, opts_v, flags)


def print_summary(console: Console, plan: EnginePlan) -> None:
    title = {"baseline": "monolithic baseline (no connector, no split)",
             "offload": "with a key-value cache tier", "prefill": "prefill instance (producer)",
             "decode": "decode instance (consumer)", "llama": "llama-server with its cache tiers",
             "shared-a": "instance a, sharing a key-value store",
             "shared-b": "instance b, sharing a key-value store"}.get(plan.role, plan.role)
    console.print(f"==> {plan.engine} {title}")
    width = max(len(k) for k, _ in plan.summary) if plan.summary else 0
    for key, value in plan.summary:
        console.print(f"    {key:<{width}}  {value}")
    if plan.label_hint and plan.label_hint != plan.role:
        console.print(f"\n    Suggested label for the measurement:  {plan.label_hint}")
    for note in plan.notes:
        console.print(f"    note: {note}")
    console.print(f"\n    {plan.shell_line()}\n")


@click.command("serve", context_settings={"ignore_unknown_options": False})
@click.argument("role", type=click.Choice(ALL_ROLES))
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", help="Model to load (default: MODEL, or SMALL_MODEL when split).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: the role's).")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--connector", help="Override CONNECTOR for this instance.")
@click.option("--offload/--no-offload", default=None, help="Override OFFLOAD (offload role).")
@json_option
@click.pass_context
def serve_command(ctx: click.Context, role: str, engine_args: tuple[str, ...], model: str | None,
                  port: int | None, dry_run: bool, connector: str | None, offload: bool | None,
                  as_json: bool) -> None:
    """Start one engine in a lab ROLE in the foreground (Ctrl-C stops it).

    Roles: baseline, offload, shared-a, shared-b, prefill, decode (vLLM), llama
    (llama-server), and proxy (kvlab's prefill/decode proxy in front of PREFILL_HOST:PORT and
    DECODE_HOST:PORT). Put engine arguments after `--`.
    """
    if role == "proxy":  # the seed's run-proxy.sh: both legs checked first, then serve
        from kvlab.cli.proxy_cmd import proxy_command

        if dry_run or engine_args:
            raise click.UsageError("serve proxy takes no --dry-run and no engine arguments; "
                                   "see `kvlab proxy --help`")
        ctx.invoke(proxy_command, port=port, connector=connector, as_json=as_json)
        return
    loaded = settings_from(ctx, connector=connector, offload=offload)
    plan = build_plan(loaded, role, model, port, tuple(engine_args), probe=not dry_run)
    out = Output(as_json)
    if dry_run:
        out.result({"plan": plan.as_dict(), "dry_run": True},
                   lambda console: print_summary(console, plan))
        return
    print_summary(out.err if as_json else out.console, plan)
    result = asyncio.run(serve_foreground(loaded.values, plan))
    out.result(result, lambda console: console.print(f"stopped (exit {result['exit_code']})"))


def serve_log(settings: Settings, plan: EnginePlan) -> Path:
    """Where a foreground engine's log goes (`kvlab llama` finds a server's log there)."""
    return settings.paths().log(f"serve-{plan.role}-{plan.port}")


async def serve_foreground(settings: Settings, plan: EnginePlan) -> dict[str, object]:
    """Start `plan`, record its startup line, echo its log until it stops (Ctrl-C stops it).

    Shared by `kvlab serve` and `kvlab llama serve`.
    """
    from kvlab.engines import startup
    from kvlab.engines.process import EngineProcess
    from kvlab.records import notebook

    run_dir = settings.paths().run
    log = serve_log(settings, plan)
    log.unlink(missing_ok=True)
    secrets = {"HF_TOKEN": settings.hf_token.get_secret_value()} if settings.hf_token else {}
    proc = EngineProcess(plan, log, run_dir=run_dir, secret_env=secrets, echo=sys.stderr)
    recorded: dict[str, object] = {}
    async with proc:
        version = await startup.server_version(plan)
        line = startup.record(plan, proc.log_text(), ready_s=proc.ready_s, engine_version=version)
        notebook.append(settings.labbook, line)
        recorded = {"startup": line.capacity, "ready_s": proc.ready_s}
        print(f"\n==> ready after {proc.ready_s:.1f} s at {plan.base_url}; startup line "
              f"appended to {settings.labbook}. Ctrl-C stops it.", file=sys.stderr)
        await proc.wait_exit()
    return {**recorded, "exit_code": proc.returncode, "log": str(log)}


COMMANDS = (serve_command,)
