"""The `kvlab` command line: parse, make one library call, render.

The error boundary is here and only here: a `KvlabError` becomes one line on stderr and its
exit code (2); Ctrl-C exits 130; anything else is a bug and keeps its traceback. Command
modules import heavy libraries inside their functions so `kvlab --help` stays instant.
"""

from __future__ import annotations

import sys

import click

from kvlab.cli import (
    clean_cmd,
    demo_cmd,
    engines_cmd,
    llama_cmd,
    load_cmd,
    note_cmd,
    plan_cmd,
    predict_cmd,
    proxy_cmd,
    report_cmd,
    reuse_cmd,
    run_cmd,
    schema_cmd,
    serve_cmd,
    settings_cmd,
)
from kvlab.cli.common import GlobalOptions
from kvlab.core import VERSION, KvlabError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(VERSION, prog_name="kvlab")
@click.option("--env-file", type=click.Path(dir_okay=False), default=None,
              help="Settings file to read instead of ./.env.")
@click.pass_context
def cli(ctx: click.Context, env_file: str | None) -> None:
    """Measure and prove KV-cache reuse on your own machines (vLLM, llama.cpp, mlx-lm)."""
    ctx.obj = GlobalOptions(env_file=env_file)


for module in (settings_cmd, predict_cmd, serve_cmd, engines_cmd, demo_cmd, reuse_cmd,
               llama_cmd, run_cmd, proxy_cmd, load_cmd, plan_cmd, report_cmd, note_cmd, schema_cmd,
               clean_cmd):
    for command in module.COMMANDS:
        cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point with kvlab's error boundary."""
    try:
        code = cli.main(args=argv, prog_name="kvlab", standalone_mode=False)
    except KvlabError as exc:
        click.echo(f"kvlab: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("kvlab: interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("kvlab: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    if isinstance(code, int) and code:
        sys.exit(code)
