"""`kvlab clean`: stop the engines kvlab started and remove the KV it left on disk."""

from __future__ import annotations

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from


@click.command("clean")
@click.option("--dry-run", is_flag=True, help="List what would be stopped and removed.")
@json_option
@click.pass_context
def clean_command(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Stop stray engines (recorded process groups, identified by start time, group and
    port); remove KV stores and slot files (users' prompts)."""
    from kvlab.engines import clean

    report = clean(settings_from(ctx).values, dry_run=dry_run)
    stop, remove = ("would stop", "would remove") if dry_run else ("stopped", "removed")

    def human(console: Console) -> None:
        for record in report.stopped:
            console.print(f"{stop} {record.engine} {record.role} (pid {record.pid}, port "
                          f"{record.port}; identified by its {record.identified_by})")
        for path in report.removed:
            why = report.partial.get(path)
            console.print(f"{remove} {path}" + (f" (a partial store entry: {why})" if why
                                                 else ""))
        for path in report.kept:
            console.print(f"kept (not kvlab's): {path}")
        console.print(f"{len(report.stopped)} engines, {len(report.removed)} paths, "
                      f"{report.bytes_freed:,} bytes" + (" (dry run)" if dry_run else ""))

    Output(as_json).result({**report.as_dict(), "dry_run": dry_run}, human)


COMMANDS = (clean_command,)
