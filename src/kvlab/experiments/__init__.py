"""The orchestrated experiments behind `kvlab run NAME`, and the one contract they share.

Each experiment is a module with a spec (a frozen dataclass owning its defaults and checks)
and `async def run(lab, spec) -> list[Record]`: it starts and always stops its own engines,
writes every notebook line through `lab.record`, and returns them. Modules with plans to show
also have `dry_run(lab, spec) -> list[dict]`, which starts, installs and writes nothing.

The registry names the modules (imported on use, so `kvlab --help` stays instant) and the
labs' report rows each one fills, so a failed experiment can say why those rows are empty.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from kvlab.records.models import LAB_OFFLOAD, LAB_PD

# `kvlab run disagg --part`: the load comparison (the default) and the lab's procedure steps
DISAGG_PARTS = ("load", "cancel", "boundary")
CANCEL_ROW = "A request cancelled mid-stream, then the decode worker restarted"
BOUNDARY_ROW = "Long against short prompts: where the split pays"


@dataclass(frozen=True)
class ReportRow:
    """One row of a lab's "Expected outcome" table an experiment fills."""

    lab: str
    label: str
    row: str


@dataclass(frozen=True)
class Registered:
    name: str
    module: str
    rows: tuple[ReportRow, ...]
    needs_llama_server: bool = False  # `kvlab run all` records its rows as not run without one

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


EXPERIMENTS: dict[str, Registered] = {e.name: e for e in (
    Registered("disk", "kvlab.experiments.disk",
               (ReportRow(LAB_OFFLOAD, "disk", "Disk, llama.cpp slot save and restore"),),
               True),
    Registered("interference", "kvlab.experiments.interference",
               (ReportRow(LAB_PD, "interference", "llama-server, 4 slots against 1 slot"),),
               True),
    Registered("shared-slots", "kvlab.experiments.slot_share", (), True),
    Registered("offload", "kvlab.experiments.offload",
               (ReportRow(LAB_OFFLOAD, "offload-off", "None, quiet server"),
                ReportRow(LAB_OFFLOAD, "offload-off-load", "None, cache under pressure"))),
    Registered("shared", "kvlab.experiments.shared",
               (ReportRow(LAB_OFFLOAD, "shared-store", "Shared store, two instances"),)),
    Registered("disagg", "kvlab.experiments.disagg",
               (ReportRow(LAB_PD, "baseline", "One machine, no split (baseline)"),
                ReportRow(LAB_PD, "disagg-loopback", "Two processes on one device"),
                ReportRow(LAB_PD, "cancel-restart", CANCEL_ROW),
                ReportRow(LAB_PD, "boundary", BOUNDARY_ROW))),
)}
# what `kvlab run all` runs, in order: the llama.cpp tiers (seconds) before the vLLM labs
RUN_ALL = ("disk", "interference", "offload", "shared", "disagg")


def registered(name: str) -> Registered:
    return EXPERIMENTS[name]
