"""`kvlab run NAME`'s one call: the registered experiment run in a lab of its own (`execute`),
or its plans shown without starting anything (`plans`).

Deliberately not here: what a lab is (`lab.py`) and `kvlab run all` (`everything.py`).
"""

from __future__ import annotations

import asyncio

from kvlab.cluster.placement import LOCAL, Placement
from kvlab.core import Say, Settings, quiet
from kvlab.experiments import registered
from kvlab.experiments.lab import Lab, dry_lab
from kvlab.records import Record


def execute(settings: Settings, name: str, spec: object, placement: Placement = LOCAL,
            say: Say = quiet) -> list[Record]:
    """Run the registered experiment `name` with `spec` where `placement` says; its lines."""
    lab = Lab(settings, say=say, placement=placement)

    async def run() -> list[Record]:
        async with lab.placed():
            found: list[Record] = await registered(name).load().run(lab, spec)
            return found

    return asyncio.run(run())


def plans(settings: Settings, name: str, spec: object, placement: Placement = LOCAL,
          say: Say = quiet) -> list[dict[str, object]]:
    """What `name` would start with `spec` (`--dry-run`): its plans, or why a row would not
    run; starts, installs and writes nothing. On a cluster it reads which nodes its names
    resolve to (`cluster/survey.py`: the cluster is asked, nothing is started on it)."""
    found: list[dict[str, object]] = registered(name).load().dry_run(
        dry_lab(settings, placement, say), spec)
    return found
