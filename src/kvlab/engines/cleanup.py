"""`kvlab clean`: stop strays, remove KV stores and slot files (they hold users' prompts).

Only what kvlab or the engines it runs created is removed: engine process groups kvlab
recorded, each identified by what kvlab can prove (the leader's start time, or its process
group and the port it serves; never argv0, which a wrapper script changes), the per-run
stores under KVLAB_HOME/stores, ExampleConnector entries (a 32-hex-digit directory of
.safetensors files) in KV_SHARED_PATH, llama.cpp slot files and kvlab's manifests in the slot
directories. Anything else found there is listed as kept, so a mistyped setting cannot wipe
an unrelated folder.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from kvlab.core import PROXY_METRICS_PREFIX, Settings, tree_bytes
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.strays import (
    PidRecord,
    claimed,
    live_strays,
    owned_elsewhere,
    stop_strays,
)
from kvlab.engines.vllm import store as kvstore


@dataclass
class CleanReport:
    stopped: list[PidRecord] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    partial: dict[str, str] = field(default_factory=dict)  # a store entry removed: why partial
    bytes_freed: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"stopped": [r.model_dump(mode="json", exclude_none=True) for r in self.stopped],
                "removed": self.removed, "kept": self.kept, "partial": self.partial,
                "bytes_freed": self.bytes_freed}


def clean(settings: Settings, *, dry_run: bool = False) -> CleanReport:
    report = CleanReport()
    paths = settings.paths()
    run_dir = paths.run
    if dry_run:
        report.stopped = live_strays(run_dir)
    else:
        report.stopped = stop_strays(run_dir)
    report.kept += [f"{r.engine} ({r.role}) process group {r.group} on port {r.port}: the "
                    f"kvlab that started it (pid {r.owner}) still runs it"
                    for r in owned_elsewhere(run_dir)]
    _clean_proxy_metrics(report, dry_run)
    for tree in (paths.stores, paths.scratch):
        if not tree.is_dir():
            continue
        for run in sorted(tree.iterdir()):
            if (owner := claimed(run)) is not None:
                report.kept.append(f"{run}: the kvlab that made it (pid {owner}) still runs")
                continue
            report.bytes_freed += tree_bytes(run)
            report.removed.append(str(run))
            if not dry_run:
                shutil.rmtree(run, ignore_errors=True)
    if settings.kv_shared_path:
        _clean_shared(Path(settings.kv_shared_path).expanduser(), report, dry_run)
    for slots in {Path(settings.llama_slot_save_path).expanduser(), paths.slots}:
        result = slotstore.clean(slots, dry_run=dry_run)
        report.removed += [str(slots / name) for name in result.removed]
        report.kept += [str(slots / name) for name in result.kept]
        report.bytes_freed += result.bytes_freed
    return report


def _clean_proxy_metrics(report: CleanReport, dry_run: bool) -> None:
    """A killed proxy's metrics directory (its supervisor PID is in the name, and gone)."""
    for entry in sorted(Path(tempfile.gettempdir()).glob(PROXY_METRICS_PREFIX + "*")):
        pid = entry.name.removeprefix(PROXY_METRICS_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or psutil.pid_exists(int(pid)) or not entry.is_dir():
            continue
        report.bytes_freed += tree_bytes(entry)
        report.removed.append(str(entry))
        if not dry_run:
            shutil.rmtree(entry, ignore_errors=True)


def _clean_shared(store: Path, report: CleanReport, dry_run: bool) -> None:
    if not store.is_dir():
        return
    report.partial.update({str(p.path): p.why for p in kvstore.partial_entries(store)})
    for entry in sorted(store.iterdir()):
        if not kvstore.is_entry(entry):
            report.kept.append(str(entry))
            continue
        report.bytes_freed += tree_bytes(entry)
        report.removed.append(str(entry))
        if not dry_run:
            shutil.rmtree(entry)
