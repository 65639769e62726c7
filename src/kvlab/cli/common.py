"""What every command shares: settings from the global options, and one way to output.

`Output` prints either exactly one JSON document on stdout (`--json`) or human text; progress
and notes go to stderr so `--json` output stays parseable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console

from kvlab.settings import LoadedSettings, load_settings

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print exactly one JSON document on stdout.")


@dataclass
class GlobalOptions:
    env_file: str | None = None


def settings_from(ctx: click.Context, **flags: Any) -> LoadedSettings:
    """Settings with the embedded profile, `.env`, environment and these flags applied."""
    from kvlab.profiles import embedded

    opts = ctx.find_object(GlobalOptions) or GlobalOptions()
    return load_settings(opts.env_file, flags, profile_values=embedded)


class Output:
    """Result rendering: one JSON document, or human text via a rich console."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        # markup off: engine log lines contain [brackets] that rich would eat
        self.console = Console(highlight=False, soft_wrap=True, markup=False)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

    def result(self, data: Any, human: Callable[[Console], None]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        else:
            human(self.console)

    def note(self, text: str) -> None:
        """A progress or context line: stderr under --json, stdout otherwise."""
        (self.err if self.as_json else self.console).print(text)
