"""`kvlab settings` (effective values and their sources) and `kvlab init` (env-example.txt)."""

from __future__ import annotations

from pathlib import Path

import click

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core import InputError


@click.command("settings")
@json_option
@click.pass_context
def settings_command(ctx: click.Context, as_json: bool) -> None:
    """Show each effective setting and where its value came from (secrets masked), and
    which vLLM kvlab would run here and why."""
    from kvlab.core import detect_hardware
    from kvlab.engines import VLLM, install_of
    from kvlab.report import console_engines

    loaded = settings_from(ctx)
    rows = loaded.rows()
    choice = install_of(loaded.values, VLLM).as_record()
    data = {
        "vllm": {**choice.model_dump(), "hardware": detect_hardware().as_dict()},
        "env_file": str(loaded.env_file) if loaded.env_file else None,
        "profile": loaded.profile,
        "profile_reason": loaded.profile_reason,
        "settings": {key: {"value": value, "source": source} for key, value, source in rows},
        "unknown_keys": loaded.unknown_keys,
    }

    Output(as_json).result(data, lambda c: console_engines.settings(c, loaded, choice))


@click.command("init")
@click.option("--out", type=click.Path(dir_okay=False), default="env-example.txt",
              show_default=True, help="Where to write the example settings file.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@json_option
def init_command(out: str, force: bool, as_json: bool) -> None:
    """Write a commented env-example.txt with every setting kvlab reads."""
    path = Path(out)
    if path.exists() and not force:
        raise InputError(f"{path} exists; pass --force to overwrite it")
    from kvlab.core import env_example_text

    path.write_text(env_example_text(), encoding="utf-8")
    Output(as_json).result({"written": str(path)},
                           lambda c: c.print(f"wrote {path}; copy it to .env and edit"))


COMMANDS = (settings_command, init_command)
