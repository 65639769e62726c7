"""What every command shares: settings from the global options, and one way to output.

`Output` prints either exactly one JSON document on stdout (`--json`) or human text; progress
and notes go to stderr so `--json` output stays parseable.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

import click
from rich.console import Console

from kvlab.core import LoadedSettings, ProfileValues, load_settings

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print exactly one JSON document on stdout.")


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (a time limit's `timeout`, a service manager) stops the block as Ctrl-C does:
    through asyncio's own SIGINT handling where a loop runs (it cancels and cleans up), else
    as KeyboardInterrupt."""
    def on_term(signum: int, frame: FrameType | None) -> None:
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
            raise KeyboardInterrupt  # SIGINT is ignored here (a background job)
        signal.raise_signal(signal.SIGINT)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@dataclass
class GlobalOptions:
    env_file: str | None = None


def settings_from(click_ctx: click.Context, /, **flags: object) -> LoadedSettings:
    """Settings with the embedded profile, `.env`, environment and these flags applied (a
    flag may be named `ctx`: the setting, hence the positional-only context)."""
    from kvlab.core import embedded

    return _settings(click_ctx, embedded, flags)


def server_settings(click_ctx: click.Context, /, **flags: object) -> LoadedSettings:
    """`settings_from` for a load against a URL: no profile unless KVLAB_PROFILE names one
    (`profiles.for_a_server`)."""
    from kvlab.core import for_a_server

    return _settings(click_ctx, for_a_server, flags)


def _settings(click_ctx: click.Context, profile: ProfileValues,
              flags: dict[str, object]) -> LoadedSettings:
    opts = click_ctx.find_object(GlobalOptions) or GlobalOptions()
    loaded = load_settings(opts.env_file, flags, profile_values=profile)
    if loaded.warnings and not click_ctx.meta.get("kvlab.settings_warned"):  # once per command
        click_ctx.meta["kvlab.settings_warned"] = True
        for warning in loaded.warnings:
            click.echo(f"kvlab: warning: {warning}", err=True)
    return loaded


def prepared_settings(click_ctx: click.Context, console: Console, /,
                      needs: tuple[str, ...] = ("vllm",), **flags: object) -> LoadedSettings:
    """Settings, after making what their profile and the command's engines need
    (`engines/prepare.py`): every command that starts engines calls this, so each works on a
    fresh machine, and installs only what it will start."""
    loaded = settings_from(click_ctx, **flags)
    ensure_prepared(loaded, console, needs)
    return loaded


def ensure_prepared(loaded: LoadedSettings, console: Console, needs: tuple[str, ...]) -> None:
    """`engines.prepare.prepare_for`, its progress on `console`."""
    from kvlab.engines import prepare_for

    with console.status("checking engines and models") as status:
        def say(text: str) -> None:
            status.update(text)
            console.print(f"  {text}")

        prepare_for(loaded, needs, say)


def _jsonable(value: object) -> object:
    """Typed records print as their notebook lines, their parts as their fields (no nulls);
    anything else as its text."""
    from pydantic import BaseModel

    from kvlab.records import Record

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
