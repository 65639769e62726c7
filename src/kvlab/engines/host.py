"""Where engines run, and the one way kvlab starts them.

An `EngineHost` starts a step's plans together, waits until every one is ready, writes each
one's `startup` line through its scope's `record`, yields the running processes, and stops
them all however the block ends (an error, Ctrl-C, a cancelled task). An engine that stops
serving while the block runs turns the block's error into one line naming it and its log.
`LocalHost` runs the plans on this machine; `cluster.ray_host.RayHost` runs them on Ray nodes,
one agent per node. `kvlab run` (through `experiments.Lab`), `kvlab serve`, `kvlab llama
serve`, `kvlab demo` and `kvlab serve --node` all start engines through a host, so the
startup line, the secrets kept to the environment (as `kvlab serve` passes them) and the
teardown exist once.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

import httpx

from kvlab.core import EngineError, Say, Settings
from kvlab.engines import deaths, local, reuse, startup
from kvlab.engines.plan import EnginePlan
from kvlab.engines.process import DEFAULT_READY_TIMEOUT_S, EngineProcess, orphan_note
from kvlab.records import EngineReuse, NodeInfo, StartupRecord

Running = contextlib.AbstractAsyncContextManager[list[EngineProcess]]


class Scope(Protocol):
    """What a host needs of the run it starts engines for (`experiments.Lab` is one)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def run_id(self) -> str: ...

    @property
    def say(self) -> Say: ...

    def record(self, line: StartupRecord) -> object:
        """Keep one startup line (append it to the notebook)."""
        ...


class EngineHost(Protocol):
    """Starts plans, records them, always stops them."""

    def running(self, plans: Sequence[EnginePlan], labels: Sequence[str], *,
                ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> Running:
        """The plans started and ready, each one's startup line written (`labels[i]` names
        the i-th), stopped when the block ends."""
        ...


def labels_for(plans: Sequence[EnginePlan], labels: Sequence[str]) -> list[str]:
    """Each plan's startup label, one per plan (the caller names them: `records/rows.py`)."""
    if len(labels) != len(plans):
        raise ValueError(f"{len(plans)} plans but {len(labels)} labels")
    return list(labels)


async def record_ready(scope: Scope, proc: EngineProcess, label: str,
                       node: NodeInfo | None = None,
                       reused: EngineReuse | None = None,
                       batch: str | None = None) -> StartupRecord:
    """The ready engine's startup line (its own version, its log's capacity), recorded and
    said in one line; a kept engine's (`reused`) says so, with its reset's check."""
    version = await startup.server_version(proc.plan)
    # a process on a node is not this machine's to name
    instance = local.instance_id(proc.pid) if node is None else None
    ready_s = reused.probe.reset_s if reused is not None else proc.ready_s
    line = startup.record(proc.plan, proc.log_text(), ready_s=ready_s,
                          engine_version=version, label=label, node=node, instance=instance)
    if (held := await startup.server_capacity(proc.plan)) is not None:
        line.capacity = held
    line.reused, line.start_batch = reused, batch
    scope.record(line)
    on = f" on node {node.node}" if node is not None else ""
    how = (f"kept from {reused.started_as}, its cache reset (a probe: "
           f"{reused.probe.cached_before} cached tokens before, {reused.probe.cached_after} "
           f"after) in {reused.probe.reset_s:.1f} s" if reused is not None
           else f"ready in {proc.ready_s or 0:.0f} s")
    scope.say(f"    {proc.plan.role} {how}{on}: " + "; ".join(line.capacity.lines))
    if line.version_note:
        scope.say(f"    note: {line.version_note}")
    if (note := orphan_note(proc)):
        scope.say(f"    note: {note}")
    return line


def choice_line(plan: EnginePlan) -> str:
    """Which build the plan runs and why, as the plan states it ("" if it does not)."""
    choice = plan.startup_facts.engine_choice
    if choice is None:
        return ""
    return f"{plan.engine}: {choice.command} ({choice.origin}): {choice.reason}"


def death_cause(proc: EngineProcess) -> str | None:
    """Why the engine stopped, as its log says (`engines/deaths.py`), or None."""
    return deaths.cause(proc.log_text(), kv_store=deaths.writes_kv_store(proc.plan.argv()))


def error_tail(proc: EngineProcess) -> str:
    """The engine log's cause of death, else its last lines."""
    return death_cause(proc) or proc.log_tail(2)


@dataclass
class LocalHost:
    """Engines on this machine, each in its own process group, logs under `log_dir`.

    `echo` copies each log as it grows (a foreground `kvlab serve`); `detached` leaves the
    engines running once ready (`kvlab serve --detach`; `kvlab clean` stops them). A log is
    `<log_prefix><role>-<port>.log`, fresh at each start. `started` holds the last block's
    processes, so a caller still has them after the block ends (their exit codes).
    """

    scope: Scope
    log_dir: Path
    echo: TextIO | None = None
    detached: bool = False
    log_prefix: str = ""
    started: list[EngineProcess] = field(default_factory=list)
    pool: reuse.EnginePool | None = None  # a pass's kept engines (`engines/reuse.py`)

    @contextlib.asynccontextmanager
    async def running(self, plans: Sequence[EnginePlan], labels: Sequence[str],
                      *, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                      ) -> AsyncIterator[list[EngineProcess]]:
        """The plans' companions first (each ready and recorded as `<label>-<its role>`),
        then the plans; stopped in the reverse order."""
        names = labels_for(plans, labels)
        first = [(c, f"{label}-{c.role}") for p, label in zip(plans, names, strict=True)
                 for c in p.companions]
        async with contextlib.AsyncExitStack() as stack:
            if first:
                await stack.enter_async_context(self._running(
                    [c for c, _ in first], [n for _, n in first],
                    ready_timeout_s=ready_timeout_s))
            yield await stack.enter_async_context(self._running(
                plans, names, ready_timeout_s=ready_timeout_s))

    @contextlib.asynccontextmanager
    async def _running(self, plans: Sequence[EnginePlan], labels: Sequence[str],
                       *, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                       ) -> AsyncIterator[list[EngineProcess]]:
        names = labels_for(plans, labels)
        settings = self.scope.settings
        if self.pool is not None:
            plans = [reuse.poolable(p) for p in plans]
        kept = await self._reused(plans)
        procs = [kept[i].proc if i in kept else
                 EngineProcess(p, self.log_dir / f"{self.log_prefix}{p.role}-{p.port}.log",
                               run_dir=settings.paths().run,
                               secret_env=settings.engine_secret_env(),
                               ready_timeout_s=ready_timeout_s, detached=self.detached)
                 for i, p in enumerate(plans)]
        fresh = [p for i, p in enumerate(procs) if i not in kept]
        self.started = procs
        stopping, clean = True, False
        try:
            for proc in fresh:
                proc.log_path.unlink(missing_ok=True)
                proc.start()
                if self.echo is not None:
                    proc.echo_log(self.echo)
            if fresh:
                self.scope.say("    starting " + ", ".join(f"{p.plan.role}:{p.plan.port}"
                                                          for p in fresh))
            for choice in dict.fromkeys(c for p in fresh if (c := choice_line(p.plan))):
                self.scope.say(f"    {choice}")
            await asyncio.gather(*(p.wait_ready() for p in fresh))
            batch = secrets.token_hex(4) if len(fresh) > 1 else None
            for i, (proc, label) in enumerate(zip(procs, names, strict=True)):
                await record_ready(self.scope, proc, label,
                                   reused=kept[i].reuse if i in kept else None,
                                   batch=None if i in kept else batch)
            async with _watched(procs):
                yield procs
            stopping, clean = not self.detached, True
        finally:
            if clean and stopping and self.pool is not None:  # an error stops them all
                procs = [p for p, label in zip(procs, names, strict=True)
                         if not self.pool.keep(p, label)]
            await asyncio.shield(asyncio.gather(*(_stop(p, stopping) for p in procs)))

    async def _reused(self, plans: Sequence[EnginePlan]) -> dict[int, _Reused]:
        """The pool's engines that `plans` can use, each reset and checked (one whose check
        fails is stopped, and its plan starts fresh)."""
        if self.pool is None:
            return {}
        claimed = await self.pool.claim(plans)
        out: dict[int, _Reused] = {}
        try:
            for i, kept in claimed.items():
                if (line := await self._checked(kept)) is not None:
                    out[i] = _Reused(kept.proc, line)
        except BaseException:  # cancelled mid-check: what was claimed is nobody's, stop it
            await asyncio.shield(asyncio.gather(*(k.proc.stop() for k in claimed.values())))
            raise
        return out

    async def _checked(self, kept: reuse.Kept) -> EngineReuse | None:
        """The kept engine reset and its reset proven, else stopped (None)."""
        try:
            probe = await reuse.reset_checked(kept.proc.plan, self.scope.settings.api_key())
        except httpx.HTTPError as exc:
            self.scope.say(f"    {kept.label}'s engine: the reset failed ({exc}); a fresh one "
                           "starts")
            await kept.proc.stop()
            return None
        if not probe.ok:
            self.scope.say(f"    {kept.label}'s engine: the reset probe read "
                           f"{probe.cached_before} cached tokens before and "
                           f"{probe.cached_after} after; a fresh one starts")
            await kept.proc.stop()
            return None
        return reuse.reuse_line(kept, probe)


@dataclass(frozen=True)
class _Reused:
    proc: EngineProcess
    reuse: EngineReuse


async def _stop(proc: EngineProcess, stopping: bool) -> None:
    if stopping or proc.returncode is not None:
        await proc.stop()
    else:
        await proc.release()


@contextlib.asynccontextmanager
async def _watched(procs: Sequence[EngineProcess]) -> AsyncIterator[None]:
    """An error inside names the engine that stopped serving, if one did: its death, not
    what its client saw, is the cause."""
    try:
        yield
    except Exception as exc:
        for p in procs:
            if not await p.healthy():
                raise EngineError(
                    f"{p.plan.engine} ({p.plan.role}) stopped serving during the run "
                    f"(exit {p.returncode}); {p.log_path}: {error_tail(p)}") from exc
        raise
