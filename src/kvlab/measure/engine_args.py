"""Two runs' engines, argument by argument: the one-variable rule applied to what the engines
ran, not to what the settings were.

Each load row names the engines it measured with their effective arguments, as the instance
stated them (`records/evidence.EngineLine`: vLLM's startup log, else the process's command
line). Two runs are one experiment only if their engines agree on every argument but where
they listen and the variable kvlab's experiments change (the connector, the host tier: each
engine's `variable_args`), or one the user names as the variable under test.

An argument one engine's startup log leaves out is the engine's default there. Between a
log and a command line that is not comparable (a command line names defaults too), so two
engines described by different sources are compared only on the arguments both name.
Engines that state no arguments (another machine's, rows written before kvlab recorded
them) are not compared, and the comparison says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvlab.engines import known_engine
from kvlab.records import EngineLine, LinkRecord, LoadRecord

DEFAULT = "the engine's default"


@dataclass(frozen=True)
class ArgDifference:
    """One argument two engines ran with differently, and each engine named."""

    name: str
    value_a: str
    value_b: str
    engine_a: str
    engine_b: str

    def message(self, label_a: str, label_b: str) -> str:
        return (f"{self.name} {self.value_a} in {label_a} ({self.engine_a}) against "
                f"{self.value_b} in {label_b} ({self.engine_b})")


def engines_of(rows: Iterable[LoadRecord], link: LinkRecord | None = None) -> list[EngineLine]:
    """The distinct engines a run's rows (and its link line) name."""
    found: dict[tuple[str, str | None, str | None], EngineLine] = {}
    for engines in [*(r.engines for r in rows), link.engines if link else None]:
        for e in engines or []:
            found.setdefault((e.url, e.instance, e.startup), e)
    return list(found.values())


def _named(e: EngineLine) -> str:
    startup = f"startup line {e.startup}" if e.startup else "no startup line"
    source = e.args.detail or e.args.source if e.args else "no arguments"
    return f"{e.role} {e.url}, {startup}, from {source}"


def _variable(a: EngineLine, b: EngineLine) -> frozenset[str]:
    engines = [known_engine(e.engine) for e in (a, b) if e.engine]
    return frozenset().union(*(e.variable_args for e in engines if e is not None))


def pair_differences(a: EngineLine, b: EngineLine,
                     ignore: Iterable[str] = ()) -> list[ArgDifference]:
    """Every argument `a` and `b` ran with differently (see the module docstring)."""
    if a.args is None or b.args is None:
        return []
    va, vb = a.args.values, b.args.values
    names = set(va) | set(vb) if a.args.source == b.args.source else set(va) & set(vb)
    skip = _variable(a, b) | set(ignore)
    return [ArgDifference(n, va.get(n, DEFAULT), vb.get(n, DEFAULT), _named(a), _named(b))
            for n in sorted(names - skip) if va.get(n) != vb.get(n)]


def differences(side_a: list[EngineLine], side_b: list[EngineLine],
                ignore: Iterable[str] = ()) -> list[ArgDifference]:
    """Every argument in which an engine of one run differs from one of the other, each
    argument and pair of values once."""
    found: dict[tuple[str, str, str], ArgDifference] = {}
    for a in side_a:
        for b in side_b:
            for d in pair_differences(a, b, tuple(ignore)):
                found.setdefault((d.name, d.value_a, d.value_b), d)
    return list(found.values())


def refusal(label_a: str, label_b: str, found: list[ArgDifference]) -> str:
    """One line naming every differing argument with both values."""
    shown = "; ".join(d.message(label_a, label_b) for d in found)
    return (f"the two runs' engines differ beyond the variable under test: {shown}; start "
            "both with the same engine arguments, or pass --ignore-arg NAME for the one you "
            "meant to vary")


def not_compared(label: str, engines: list[EngineLine]) -> str | None:
    """Why `label`'s engines' arguments could not be compared (None: they could)."""
    if not engines:
        return (f"engine arguments not compared: {label}'s rows name no engines (written "
                "before kvlab recorded them, or no engine answered)")
    blind = [e.url for e in engines if e.args is None]
    if blind:
        return (f"engine arguments not compared for {', '.join(blind)} ({label}): the instance "
                "stated none (another machine's, or a process this account cannot read)")
    return None
