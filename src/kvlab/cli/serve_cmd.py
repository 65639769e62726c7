"""`kvlab serve ROLE`: one engine in the foreground, like the seed's serve scripts.

It prints the same configuration summary first (with the context, slots and block size the
engine arguments after `--` set, since they come last and win), then serves the engine
(`experiments/serve.py`: a `startup` line once it is ready, what the engine reports, a stop on
Ctrl-C, SIGTERM or SIGHUP) and exits with the engine's status (128 + N for a signal N). On
Linux the engine also stops if kvlab is killed outright, unless `--detach` asked for it to
keep running. `--dry-run` prints the plan and starts nothing; arguments after `--` reach the
engine as is; secrets among them are shown as `<redacted>`. `--node NAME` (with `--cluster
ADDRESS` or RAY_ADDRESS) serves the engine on that Ray node instead.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core import connectors
from kvlab.engines import ENGINE_ROLES, plan_for_role

if TYPE_CHECKING:
    from kvlab.experiments.serve import Served

detach_option = click.option(
    "--detach", is_flag=True,
    help="Leave the engine running once it is ready (`kvlab clean` stops it).")


@click.command("serve", context_settings={"ignore_unknown_options": False})
@click.argument("role", type=click.Choice((*ENGINE_ROLES, "proxy")))
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", help="Model to load (default: MODEL, or SMALL_MODEL when split).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: the role's).")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--connector", type=click.Choice(connectors.NAMES),
              help="Override CONNECTOR for this instance.")
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
    (llama-server), mlx (mlx-lm's server, MODEL's directory), and proxy (kvlab's
    prefill/decode proxy in front of PREFILL_HOST:PORT and DECODE_HOST:PORT). MONOLITHIC=1
    makes `decode` the baseline, as serve-decode.sh does.
    Put engine arguments after `--`.
    """
    if role == "proxy":  # the seed's run-proxy.sh: both legs checked first, then serve
        from kvlab.cli.proxy_cmd import proxy_command

        if dry_run or engine_args or detach:
            raise click.UsageError("serve proxy takes no --dry-run, --detach or engine "
                                   "arguments; see `kvlab proxy --help`")
        ctx.invoke(proxy_command, port=port, connector=connector, as_json=as_json)
        return
    from kvlab.experiments import serve
    from kvlab.report import console_engines

    loaded = settings_from(ctx, connector=connector, offload=offload)
    plan = plan_for_role(loaded, role, model, port, tuple(engine_args), probe=not dry_run)
    out = Output(as_json)
    if dry_run:
        out.result({"plan": plan.as_dict(), "dry_run": True},
                   lambda c: console_engines.plan(c, plan))
        return
    console_engines.plan(out.err if as_json else out.console, plan)
    if node or cluster:
        if detach:
            raise click.UsageError("--detach with --node: an engine on a node lives as long as "
                                   "the kvlab that placed it")
        from kvlab.cluster.placement import from_options

        where = from_options(loaded.values, cluster, node or "")
        served = asyncio.run(serve.serve_on_node(loaded.values, plan, where))
    else:
        served = asyncio.run(serve.serve_here(loaded.values, plan, detach=detach))
    finish(ctx, out, served)


def finish(ctx: click.Context, out: Output, served: Served) -> None:
    """Print how the engine ended and exit with its status (shared with `kvlab llama serve`)."""
    result = {"startup": served.startup, "ready_s": served.ready_s,
              "reported": served.reported, "exit_code": served.exit_code,
              "exit_status": served.exit_status, "log": str(served.log),
              "stopped_by": served.stopped_by, "outcome": served.outcome, "pid": served.pid,
              "node": served.node}
    out.result(result, lambda console: console.print(served.outcome))
    if served.exit_status:
        ctx.exit(served.exit_status)


COMMANDS = (serve_command,)
