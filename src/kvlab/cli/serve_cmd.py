"""`kvlab serve ROLE`: one engine in the foreground, like the seed's serve scripts.

It prints the same configuration summary first (with the context, slots and block size the
engine arguments after `--` set, since they come last and win), starts the engine, records a
`startup` line (KV cache size, maximum concurrency) once it is ready, says what the running
engine itself reports (context, block size, KV cache), and stops the engine's whole process
group on Ctrl-C, SIGTERM or SIGHUP (a script's background job ignores Ctrl-C; a closed
terminal sends SIGHUP). kvlab then exits with the engine's status (128 + N for a signal N),
and says so when the engine died by itself. On Linux the engine also stops if kvlab is
killed outright (`engines/process.py`), unless `--detach` asked for it to keep running.
`--dry-run` prints the plan and starts nothing; arguments after `--` reach the engine as is;
secrets among them are shown as `<redacted>`. `--node NAME` (with `--cluster ADDRESS` or
RAY_ADDRESS) serves the engine on that Ray node instead (`cluster/serve.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core.settings import LoadedSettings, Settings
from kvlab.engines import llamacpp, vllm
from kvlab.engines.base import known_engine
from kvlab.engines.plan import EnginePlan

ALL_ROLES = (*vllm.ROLES, "llama", "proxy")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
detach_option = click.option(
    "--detach", is_flag=True,
    help="Leave the engine running once it is ready (`kvlab clean` stops it).")


def build_plan(loaded: LoadedSettings, role: str, model: str | None, port: int | None,
               extra: tuple[str, ...], *, probe: bool) -> EnginePlan:
    """The plan for `role`, probing vLLM's flags only where the role needs them."""
    settings = loaded.values
    if role == "llama":
        binary = llamacpp.find_llama_server(settings) or "llama-server"
        opts = llamacpp.LlamaOptions(model=model, port=port, extra_args=extra)
        return llamacpp.plan(settings, binary, opts).with_secrets(settings.known_secrets())
    install = vllm.find_vllm(settings)
    if probe:
        vllm.require_found(install)
    flags = None
    if probe and role == "offload" and settings.offload:
        flags = vllm.accepted_flags(install, settings.paths().flag_probes)
    opts_v = vllm.PlanOptions(model=model, port=port, extra_args=extra, monolithic_switch=True)
    return vllm.plan(settings, role, install, opts_v, flags).with_secrets(
        settings.known_secrets())


def print_summary(console: Console, plan: EnginePlan) -> None:
    title = {"baseline": "monolithic baseline (no connector, no split)",
             "offload": "with a key-value cache tier", "prefill": "prefill instance (producer)",
             "decode": "decode instance (consumer)", "llama": "llama-server with its cache tiers",
             "shared-a": "instance a, sharing a key-value store",
             "shared-b": "instance b, sharing a key-value store"}.get(plan.role, plan.role)
    console.print(f"==> {plan.engine} {title}")
    summary = as_started(plan)
    width = max(len(k) for k, _ in summary) if summary else 0
    for key, value in summary:
        console.print(f"    {key:<{width}}  {value}")
    if plan.label_hint and plan.label_hint != plan.role:
        console.print(f"\n    Suggested label for the measurement:  {plan.label_hint}")
    for note in plan.notes:
        console.print(f"    note: {note}")
    console.print(f"\n    {plan.shell_line()}\n")


def as_started(plan: EnginePlan) -> list[tuple[str, str]]:
    """The plan's summary with the context, block size and slots the engine will really use:
    arguments after `--` come last on its command line, and the last value wins."""
    engine = known_engine(plan.engine)
    summary = list(plan.summary)
    if engine is None or not plan.extra_args:
        return summary
    own = engine.launch_settings(plan.argv()[:len(plan.argv()) - len(plan.extra_args)])
    real = engine.launch_settings(plan.argv())
    ctx = real.context_tokens or own.context_tokens
    slots = real.slots or own.slots
    changed = {
        "context": (own.context_tokens, real.context_tokens),
        "slots": (own.slots, real.slots),
        "per slot": ((own.context_tokens or 0) // (own.slots or 1),
                     (ctx or 0) // (slots or 1) if ctx and slots else None),
        "block": (own.block_size, real.block_size),
    }
    out = []
    for key, value in summary:
        word = _summary_word(key)
        before, after = changed.get(word, (None, None)) if word else (None, None)
        if after is not None and str(before) == value and after != before:
            value = f"{after} (set by the engine arguments after --; the settings say {before})"
        out.append((key, value))
    if real.block_size is not None and own.block_size is None:
        out.append(("block size", f"{real.block_size} (set by the engine arguments after --)"))
    return out


def _summary_word(key: str) -> str | None:
    """Which launch setting a summary line states, by its words (plans name them so)."""
    if "per slot" in key:
        return "per slot"
    if "context" in key or "model length" in key:
        return "context"
    if key == "slots":
        return "slots"
    return "block" if "block" in key else None


@click.command("serve", context_settings={"ignore_unknown_options": False})
@click.argument("role", type=click.Choice(ALL_ROLES))
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", help="Model to load (default: MODEL, or SMALL_MODEL when split).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: the role's).")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--connector", help="Override CONNECTOR for this instance.")
@click.option("--offload/--no-offload", default=None, help="Override OFFLOAD (offload role).")
@detach_option
@click.option("--node", metavar="NAME", help="Serve on this Ray node (its address, host name, "
              "node id or kvlab-host label) of the --cluster (default: RAY_ADDRESS).")
@click.option("--cluster", metavar="ADDRESS", help="The Ray cluster --node is in.")
@json_option
@click.pass_context
def serve_command(ctx: click.Context, role: str, engine_args: tuple[str, ...], model: str | None,
                  port: int | None, dry_run: bool, connector: str | None, offload: bool | None,
                  detach: bool, node: str | None, cluster: str | None, as_json: bool) -> None:
    """Start one engine in a lab ROLE in the foreground (Ctrl-C, SIGTERM or SIGHUP stops it;
    kvlab exits with the engine's status).

    Roles: baseline, offload, shared-a, shared-b, prefill, decode (vLLM), llama
    (llama-server), and proxy (kvlab's prefill/decode proxy in front of PREFILL_HOST:PORT and
    DECODE_HOST:PORT). MONOLITHIC=1 makes `decode` the baseline, as serve-decode.sh does.
    Put engine arguments after `--`.
    """
    if role == "proxy":  # the seed's run-proxy.sh: both legs checked first, then serve
        from kvlab.cli.proxy_cmd import proxy_command

        if dry_run or engine_args or detach:
            raise click.UsageError("serve proxy takes no --dry-run, --detach or engine "
                                   "arguments; see `kvlab proxy --help`")
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
    if node or cluster:
        if detach:
            raise click.UsageError("--detach with --node: an engine on a node lives as long as "
                                   "the kvlab that placed it")
        from kvlab.cluster.placement import from_options

        where = from_options(loaded.values, cluster, node or "")
        result = asyncio.run(serve_on_node(loaded.values, plan, where))
    else:
        result = asyncio.run(serve_foreground(loaded.values, plan, detach=detach))
    finish(ctx, out, result)


async def serve_on_node(settings: Settings, plan: EnginePlan, where: Any) -> dict[str, Any]:
    """`plan` served on its Ray node until it exits or a stop signal (`cluster/serve.py`)."""
    from kvlab.cluster import serve

    plan = plan.with_secrets(settings.known_secrets())
    log = serve_log(settings, plan)
    received: list[int] = []
    found: dict[str, Any] = {"log": str(log)}
    with _stopped_by_signals(received):
        try:
            found = await serve.serve_on_node(settings, plan, where, log, sys.stderr, found)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not received or task is None:
                raise
            task.uncancel()  # our own signal handler's cancel: the engine is stopped
    code = found.get("exit_code")
    status = 128 + received[0] if received else exit_status(code)
    return {**found, "exit_status": status,
            "stopped_by": _signal_name(received[0]) if received else None,
            "outcome": _outcome(plan, code, received) + f" (on node {where.target(plan.role)[1]})"}


def finish(ctx: click.Context, out: Output, result: dict[str, Any]) -> None:
    """Print how the engine ended and exit with its status (shared with `kvlab llama serve`)."""
    out.result(result, lambda console: console.print(result["outcome"]))
    if result["exit_status"]:
        ctx.exit(int(result["exit_status"]))


def exit_status(code: int | None) -> int:
    """A process's exit as a shell reports it: its code, or 128 + N when signal N ended it."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def _outcome(plan: EnginePlan, code: int | None, received: list[int]) -> str:
    """One line: who ended the engine, and how it exited."""
    what = f"{plan.engine} ({plan.role})"
    how = f"killed by {_signal_name(-code)}" if code is not None and code < 0 \
        else f"exit {code}"
    if received:
        return f"stopped on {_signal_name(received[0])}: {what} ended ({how})"
    return f"{what} exited by itself ({how}, status {exit_status(code)}): see its log"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def serve_log(settings: Settings, plan: EnginePlan) -> Path:
    """Where a foreground engine's log goes (`kvlab llama` finds a server's log there)."""
    return settings.paths().log(f"serve-{plan.role}-{plan.port}")


async def serve_foreground(settings: Settings, plan: EnginePlan, *,
                           detach: bool = False) -> dict[str, Any]:
    """Start `plan`, record its startup line, echo its log until it stops (Ctrl-C, SIGTERM or
    SIGHUP stops it); with `detach`, return once it is ready and leave it running.

    Shared by `kvlab serve` and `kvlab llama serve`.
    """
    from kvlab.engines.process import EngineProcess

    plan = plan.with_secrets(settings.known_secrets())
    log = serve_log(settings, plan)
    log.unlink(missing_ok=True)
    proc = EngineProcess(plan, log, run_dir=settings.paths().run,
                         secret_env=settings.engine_secret_env(), echo=sys.stderr,
                         detached=detach)
    recorded: dict[str, Any] = {}
    received: list[int] = []
    with _stopped_by_signals(received):
        try:
            async with proc:
                recorded = await _record_startup(settings, plan, proc, detach)
                if not detach:
                    await proc.wait_exit()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not received or task is None:
                raise
            task.uncancel()  # our own signal handler's cancel, now handled
    if detach and proc.returncode is None:
        return {**recorded, "exit_code": None, "exit_status": 0, "pid": proc.pid,
                "log": str(log), "outcome": f"{plan.engine} ({plan.role}) left running as "
                f"process group {proc.pid}; `kvlab clean` stops it"}
    code = proc.returncode
    return {**recorded, "exit_code": code, "exit_status": exit_status(code), "log": str(log),
            "stopped_by": _signal_name(received[0]) if received else None,
            "outcome": _outcome(plan, code, received)}


async def _record_startup(settings: Settings, plan: EnginePlan, proc: Any,
                          detach: bool) -> dict[str, Any]:
    """Append the ready engine's `startup` line to the notebook; what the result shows."""
    from kvlab.engines import startup
    from kvlab.records import notebook

    version = await startup.server_version(plan)
    line = startup.record(plan, proc.log_text(), ready_s=proc.ready_s, engine_version=version)
    notebook.append(settings.labbook, line)
    stop = "`kvlab clean` stops it" if detach else "Ctrl-C stops it"
    print(f"\n==> ready after {proc.ready_s:.1f} s at {plan.base_url}; startup line "
          f"appended to {settings.labbook}. {stop}.", file=sys.stderr)
    reported = await engine_reports(plan.base_url)
    if reported:
        print("    the engine reports: " + ", ".join(f"{k} {v}" for k, v in reported.items()),
              file=sys.stderr)
    return {"startup": line.capacity, "ready_s": proc.ready_s, "reported": reported}


async def engine_reports(base_url: str) -> dict[str, Any]:
    """Context, block size and KV cache size as the running engine states them (what the
    summary printed before start could only take from the plan)."""
    import httpx

    from kvlab.core.errors import KvlabError
    from kvlab.measure.compat import probe

    try:
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            facts = await probe(client, base_url)
    except KvlabError:
        return {}
    shown = {"context": facts.max_model_len, "block size": facts.block_size,
             "KV cache tokens": facts.kv_cache_tokens, "KV type": facts.cache_dtype}
    return {k: v for k, v in shown.items() if v is not None}


@contextlib.contextmanager
def _stopped_by_signals(received: list[int]) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP cancel the current task (so `async with` stops the
    engine, as Ctrl-C does) and are noted in `received`."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if not received and task is not None:
            task.cancel()
        received.append(signum)

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


COMMANDS = (serve_command,)
