"""What `kvlab settings`, `kvlab engines`, `kvlab serve` and `kvlab llama serve` print, for a
person at a terminal: every effective setting and its source, the engines installed and the
vLLM chosen, and an engine's plan with the values it will start with (and llama.cpp's tiers,
as its README describes them).

It renders a machine's settings and engines before anything runs; what a run wrote is
`console_run.py`'s. Nothing here starts an engine, measures, or decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from kvlab.core import LoadedSettings
from kvlab.engines import TITLES, EnginePlan, EngineStatus, as_started
from kvlab.records import EngineChoice, serve_label


def settings(console: Console, loaded: LoadedSettings, choice: EngineChoice) -> None:
    """Every effective setting and where it came from; the profile; the vLLM chosen."""
    table = Table("setting", "value", "source", box=None, pad_edge=False)
    for column in table.columns:
        column.overflow = "fold"
    for key, value, source in loaded.rows():
        table.add_row(key, value, source)
    console.print(table)
    console.print(f"\nprofile: {loaded.profile} ({loaded.profile_reason or 'none'})")
    console.print(f"vllm: {choice.command} ({choice.origin}, {choice.platform}): "
                  f"{choice.reason}")
    console.print(f"settings file: {loaded.env_file or 'none (./.env not found)'}")
    if loaded.unknown_keys:
        console.print("unknown keys in the settings file (ignored): "
                      + ", ".join(loaded.unknown_keys))


def engines(console: Console, lines: Sequence[EngineStatus],
            choice: EngineChoice | None) -> None:
    """Which engines are installed, where, and which vLLM kvlab would run here."""
    table = Table("engine", "installed", "version", "path", "detail", box=None)
    for s in lines:
        table.add_row(s.name, "yes" if s.installed else "no", s.version, s.path, s.detail)
    console.print(table)
    if choice is not None:
        console.print(f"\nvllm used: {choice.command} ({choice.origin}, "
                      f"{choice.platform}): {choice.reason}")


# --- a plan ---------------------------------------------------------------------------------
LLAMA_TIERS = """\
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


def plan(console: Console, plan: EnginePlan) -> None:
    """A plan as the seed's serve scripts print it, with the values the engine will use."""
    console.print(f"==> {plan.engine} {TITLES.get(plan.role, plan.role)}")
    summary = as_started(plan)
    width = max(len(k) for k, _ in summary) if summary else 0
    for key, value in summary:
        console.print(f"    {key:<{width}}  {value}")
    if (label := serve_label(plan.role, plan.host_tier)) != plan.role:
        console.print(f"\n    Suggested label for the measurement:  {label}")
    for note in plan.notes:
        console.print(f"    note: {note}")
    for first in plan.companions:
        console.print(f"\n    first, its {first.role} server (ready at {first.health_url}):"
                      f"\n    {first.shell_line()}")
    console.print(f"\n    {plan.shell_line()}\n")
