"""What every orchestrated experiment shares: one run's context, engines, stores, records.

- `Lab`: the settings, a run id, where logs go, the notebook lines written so far, and the
  temporary KV stores (created private, always removed at the end: they hold prompts);
- `host`: where the run's engines start (`engines/host.py`): this machine, or the Ray nodes
  of the run's cluster session; `engines(...)` starts several plans at once on it, waits until
  all are ready, writes each one's `startup` line, and stops them all however the block ends;
- `not_run(...)`: the line that says why a lab row cannot run on this machine, so the report
  (which reads only the notebook) can say so too;
- `pool`: in `kvlab run all`, the engines kept from one step for the next that has the same
  plan, reset and checked before they serve it (`engines/reuse.py`);
- `placement`: where the engines run, this machine by default; on a Ray cluster (`--cluster`,
  RAY_ADDRESS) `placed()` opens the run's cluster session, and `engines(...)`, `preflight`,
  `api_key()` and the stores go through it (`kvlab.cluster`, imported only then: the
  single-machine path never imports Ray).
`Lab` is the `engines.host.Scope` its hosts record through.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kvlab.cluster.placement import LOCAL, Placement
from kvlab.core import Say, Settings, quiet
from kvlab.engines import (
    EngineHost,
    EnginePlan,
    EnginePool,
    Install,
    LocalHost,
    PlanRequest,
    Running,
    claim_dir,
    install_of,
    make_plan,
    make_private_dir,
    refuse_missing_model,
    release_dir,
)
from kvlab.records import NotRunRecord, Record, Row, notebook

if TYPE_CHECKING:
    from kvlab.cluster.session import ClusterSession
    from kvlab.cluster.survey import Survey

R = TypeVar("R", bound=Record)
READY_TIMEOUT_S = 900.0  # a cold vLLM start on a loaded 2-core machine, or a GPU's first


@dataclass
class Lab:
    """One `kvlab run` invocation."""

    settings: Settings
    say: Say = quiet
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S"))
    written: list[Record] = field(default_factory=list)
    stores: list[Path] = field(default_factory=list)
    outcomes: dict[str, dict[str, object]] = field(default_factory=dict)  # per experiment run
    install_failures: dict[str, str] = field(default_factory=dict)  # engine need -> why
    install_s: float = 0.0  # seconds `kvlab run all` spent installing and building
    placement: Placement = LOCAL
    cluster: ClusterSession | None = None  # open while a cluster run runs (`placed()`)
    survey: Survey | None = None  # a cluster dry run: the nodes its names resolve to
    pool: EnginePool | None = None  # `kvlab run all`'s kept engines (`engines/reuse.py`)
    installs: dict[str, Install] = field(default_factory=dict)  # by engine, chosen once

    @contextlib.asynccontextmanager
    async def placed(self) -> AsyncIterator[Lab]:
        """The run with its placement open: on a cluster, joined, every name resolved to a
        node and one agent on each (refused before anything starts); left at the end."""
        if not self.placement.remote:
            yield self
            return
        from kvlab.cluster.session import ClusterSession

        session = ClusterSession(self.placement, self.settings, self.run_id, self.say)
        if not self.settings.loadtest_api_key_env:  # every step reads the key by this name
            self.settings = self.settings.model_copy(
                update={"loadtest_api_key_env": session.key_var})
        self.cluster = session
        try:
            await session.open()
            yield self
        finally:
            self.cluster = None
            await asyncio.shield(session.close())

    @property
    def host(self) -> EngineHost:
        """Where this run's engines start: the cluster's nodes while its session is open,
        else this machine."""
        logs = self.settings.paths().run_logs(self.run_id)
        if self.cluster is not None:
            from kvlab.cluster.runner import RayHost

            return RayHost(self, self.cluster, logs, self.stores)
        return LocalHost(self, logs, pool=self.pool)

    def api_key(self) -> str:
        """The key the run's engines expect: on a cluster the run's own (LOADTEST_API_KEY_ENV's
        or generated, never written down), else the one LOADTEST_API_KEY_ENV names."""
        return self.cluster.api_key if self.cluster else self.settings.api_key()

    async def preflight(self, plans: list[EnginePlan], store: Path | None = None,
                        writer: str = "prefill", readers: tuple[str, ...] = ()) -> None:
        """On a cluster, before anything starts: each plan's engine and model exist on its
        node, and `store` is one directory for the writer's and readers' nodes."""
        if self.cluster is None:
            return
        await self.cluster.check_paths(plans)
        if store is not None:
            await self.cluster.check_shared(store, writer, readers)

    def install(self, engine: str) -> Install:
        """The build of `engine` this run uses, chosen once (by the settings and the
        hardware: the engine's adapter says how)."""
        if engine not in self.installs:
            self.installs[engine] = install_of(self.settings, engine)
        return self.installs[engine]

    def plan(self, engine: str, role: str, request: PlanRequest | None = None,
             settings: Settings | None = None) -> EnginePlan:
        """`engine`'s plan for `role` with this run's install (and `settings`, where a step
        runs with its own copy)."""
        values = settings or self.settings
        plan = make_plan(values, engine, role, self.install(engine), request)
        if not self.placement.remote:  # a node's paths are its own (ClusterSession.check_paths)
            refuse_missing_model(values, plan)
        return plan

    def record(self, line: R) -> R:
        """Append one line to the notebook, stamped with this run, and keep it."""
        line.run_id = self.run_id
        notebook.append(self.settings.labbook, line)
        self.written.append(line)
        return line

    def not_run(self, row: Row, reason: str) -> NotRunRecord:
        """Record that a lab row cannot be measured here, and why."""
        self.say(f"    {row.title}: not run here: {reason}")
        return self.record(NotRunRecord(label=row.label, lab=row.lab, row=row.title,
                                        reason=reason))

    def store_path(self, name: str) -> Path:
        """Where this run's KV store `name` lives (nothing is created): on a cluster with
        KV_SHARED_PATH, a directory of the run's inside it (the mount the nodes share)."""
        if self.placement.remote and self.settings.kv_shared_path:
            return Path(self.settings.kv_shared_path).expanduser() / f"kvlab-{self.run_id}" / name
        return self.settings.paths().store(self.run_id, name)

    def store(self, name: str) -> Path:
        """A fresh private KV store directory for this run, removed by `cleanup()`."""
        path = self.store_path(name)
        if path.exists():
            shutil.rmtree(path)
        make_private_dir(path)
        if not self.placement.remote:  # another kvlab's `kvlab clean` leaves it alone
            claim_dir(self.settings.paths().stores / self.run_id)
        self.stores.append(path)
        return path

    def scratch(self, name: str) -> Path:
        """This run's private throw-away directory `name` (an engine's slot directory), kept
        from another kvlab's `kvlab clean` while the run lasts and removed by `cleanup()`;
        made once, never emptied under an engine that may be using it."""
        path = self.settings.paths().scratch / self.run_id / name
        if path not in self.stores:
            make_private_dir(path)
            claim_dir(path.parent)
            self.stores.append(path)
        return path

    def cleanup(self) -> None:
        """Remove the run's stores and scratch directories (they hold users' prompts)."""
        parents = {self.settings.paths().stores / self.run_id}
        for path in self.stores:
            shutil.rmtree(path, ignore_errors=True)
            parents.add(path.parent)
        for parent in parents:
            release_dir(parent)
            with contextlib.suppress(OSError):
                parent.rmdir()
        self.stores.clear()


def engines(lab: Lab, plans: list[EnginePlan], *, labels: list[str],
            ready_timeout_s: float = READY_TIMEOUT_S) -> Running:
    """Start `plans` together on the lab's host, write their startup lines, always stop them
    all (`engines/host.py`)."""
    return lab.host.running(plans, labels, ready_timeout_s=ready_timeout_s)


def dry_lab(settings: Settings, placement: Placement = LOCAL, say: Say = quiet) -> Lab:
    """A lab for a dry run: on a cluster, the nodes its names resolve to (the cluster is
    asked, nothing is started on it)."""
    lab = Lab(settings, say=say, placement=placement)
    if placement.remote:  # a run's store is named after its id, not known yet
        lab.run_id = "<run id>"
        from kvlab.cluster.survey import survey

        lab.survey = survey(placement)
    return lab
