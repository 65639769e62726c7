"""The engines of one step on a Ray cluster: placed, checked, started, watched, always stopped.

`RayHost` is the engine host (`engines/host.py`) of a run that has a cluster session:

1. each plan goes to its role's node (`placement.py`), listening on the node's address on a
   port the node's agent found free there (a plan already bound there keeps its port: a
   restarted decode keeps the URL the proxy knows); a plan with no node (kvlab's proxy, by
   default) runs where kvlab runs, as it always did;
2. every engine and model path is checked on its node before any engine starts;
3. the engines start together; each gets the run's API key in its environment (the variable
   its engine reads, never its argv), kvlab's proxy gets it as the key to send upstream (and
   to ask of clients when it runs on a node); ready means healthy on the node, within the
   deadline; each `startup` line (with its node) is written by the driver from the log the
   agent ships back into the run's log directory;
4. while the step runs, a watcher polls every engine; one that exits, or whose node or agent
   is lost, ends the step with one line naming the node and the role, and everything else is
   stopped; one that died unnoticed is reported when the step ends;
5. however the step ends, every engine is stopped and its whole log shipped back.

`RemoteEngine` is an engine an agent runs, seen from the driver as `EngineProcess` is.

`NodeReader.writer(write)` wraps the function the load sweep hands every row to: before the
sweep it reads every node's counters through its agent (the interface holding the node's
address, every RDMA port, the size of the KV store as that node sees it); on each level's row
it reads them again and records, per role, what moved since the previous reading (so a level's
figures run from the end of the level before it, warm-up included, to the end of its own); on
the link row, what moved over the whole sweep. The readings are short blocking calls made
between levels, when no request is in flight. What the bytes mean is `compare`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import ray

from kvlab.cluster.agent import UNKNOWN_ENGINE, Counters
from kvlab.cluster.placement import on_node
from kvlab.cluster.session import ClusterSession, Placed
from kvlab.core import EngineError, KvlabError, RefusedError, Settings, write_private
from kvlab.engines import (
    DEFAULT_READY_TIMEOUT_S,
    EnginePlan,
    EngineProcess,
    Scope,
    known_engine,
    labels_for,
    record_ready,
)
from kvlab.observe import netdev
from kvlab.records import LinkRecord, LoadRecord, NodeCounters, Record

WATCH_S = 2.0
ECHO_POLL_S = 1.0
READ_TIMEOUT_S = 30.0
Reading = dict[str, Counters]  # role -> one node's counters


class RemoteEngine(EngineProcess):
    """An engine a node's agent runs; its log is shipped back to `log_path` on this machine."""

    def __init__(self, session: ClusterSession, placed: Placed, plan: EnginePlan,
                 log_path: Path, secret_env: dict[str, str], ready_timeout_s: float) -> None:
        super().__init__(plan, log_path, secret_env=secret_env, ready_timeout_s=ready_timeout_s)
        self.session, self.placed = session, placed
        self.key = f"{plan.role}-{plan.port}"
        self._secrets = secret_env
        self._pid: int | None = None
        self._code: int | None = None
        self.stopped = False  # stopped on purpose (a restart): not a loss

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._code

    @property
    def where(self) -> str:
        return f"{self.plan.engine} ({self.plan.role}) on node {self.placed.name}"

    def start(self) -> None:
        raise RuntimeError("a remote engine is started by its agent: await start_remote()")

    async def start_remote(self) -> None:
        log_name = self.log_path.name
        self._pid = await self.session.call(self.placed, "start", self.key, self.plan,
                                            self._secrets, log_name, self.ready_timeout_s)

    async def wait_ready(self) -> float:
        try:
            self.ready_s = await self.session.call(self.placed, "wait_ready", self.key)
        finally:
            await self.ship()
        return float(self.ready_s or 0.0)

    async def healthy(self) -> bool:
        status = await self.session.call(self.placed, "status", self.key)
        self._code = status["returncode"]
        return bool(status["healthy"])

    async def poll(self) -> int | None:
        """The engine's exit code, None while it runs."""
        code = await self.session.call(self.placed, "poll", self.key)
        self._code = None if code == UNKNOWN_ENGINE else code
        return self._code

    async def ship(self) -> None:
        """Copy the engine's log (secrets redacted on the node) into this run's logs."""
        write_private(self.log_path, await self.session.call(self.placed, "log_text", self.key))

    async def stop(self, grace_s: float | None = None) -> int | None:
        self.stopped = True
        grace = self.stop_grace_s if grace_s is None else grace_s
        code, log = await self.session.call(self.placed, "stop", self.key, grace)
        if log:
            write_private(self.log_path, log)
        self._code = code
        return code  # type: ignore[no-any-return]


def secret_env(settings: Settings, plan: EnginePlan, session: ClusterSession) -> dict[str, str]:
    """What a process of the run gets in its environment only: an engine, the run's key as the
    variable it reads (and HF_TOKEN); kvlab's proxy, the key it sends upstream."""
    engine = known_engine(plan.engine)
    if engine is not None:
        return {**settings.engine_secret_env(), engine.api_key_env: session.api_key}
    return {session.key_var: session.api_key}


async def place(session: ClusterSession, plan: EnginePlan) -> tuple[EnginePlan, Placed | None]:
    """`plan` bound to its node's address and a port free there (None: it runs here)."""
    placed = session.where(plan.role)
    engine = known_engine(plan.engine)
    if engine is None:  # kvlab's proxy: the run's key, by its name
        env = {**plan.env, "LOADTEST_API_KEY_ENV": session.key_var}
        if placed is not None:  # beyond loopback: clients must send the key too
            env["PROXY_API_KEY_ENV"] = session.key_var
        plan = replace(plan, env=env)
    if placed is None:
        return plan, None
    if plan.host == placed.address and plan.port:
        return plan, placed  # placed before (a restart): keep the URL others know
    port = await session.call(placed, "free_port", placed.address)
    return on_node(plan, placed.address, port), placed


@dataclass
class RayHost:
    """The engines of a step on their Ray nodes (`engines.host.EngineHost`); a plan with no
    node (kvlab's proxy, by default) runs where kvlab runs. `stores` are the run's KV stores:
    one an engine creates on its node is removed there at the end. `echo` copies each node's
    log here as it grows (`kvlab serve --node`)."""

    scope: Scope
    session: ClusterSession
    log_dir: Path
    stores: Sequence[Path] = ()
    echo: TextIO | None = None

    @contextlib.asynccontextmanager
    async def running(self, plans: Sequence[EnginePlan], labels: Sequence[str],
                      *, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                      ) -> AsyncIterator[list[EngineProcess]]:
        names = labels_for(plans, labels)
        if any(p.companions for p in plans):
            raise RefusedError("LMCache's server starts beside its vLLM on one machine: run "
                               "the LMCache rows without --cluster")
        placed = [await place(self.session, p) for p in plans]
        await self.session.check_paths([p for p, where in placed if where is not None])
        for plan, where in placed:  # the run's stores an engine creates on its node
            if where is not None:
                self.session.track_stores(
                    where, [d for d in plan.private_dirs if Path(d) in self.stores])
        procs = [self._process(plan, where, ready_timeout_s) for plan, where in placed]
        tails: list[asyncio.Task[None]] = []
        try:
            for proc in procs:
                await _start(proc)
                if self.echo is not None and isinstance(proc, RemoteEngine):
                    tails.append(asyncio.create_task(_echo(proc, self.echo)))
            self.scope.say("    starting " + ", ".join(_named(p) for p in procs))
            await asyncio.gather(*(p.wait_ready() for p in procs))
            for proc, label in zip(procs, names, strict=True):
                node = proc.placed.describe() if isinstance(proc, RemoteEngine) else None
                await record_ready(self.scope, proc, label, node)
            async with watched(procs):
                yield procs
        finally:
            for tail in tails:
                tail.cancel()
            await asyncio.shield(asyncio.gather(*(_stop(p) for p in procs)))

    def _process(self, plan: EnginePlan, where: Placed | None,
                 ready_timeout_s: float) -> EngineProcess:
        settings = self.scope.settings
        env = secret_env(settings, plan, self.session)
        if where is None:
            return EngineProcess(plan, self.log_dir / f"{plan.role}-{plan.port}.log",
                                 run_dir=settings.paths().run, secret_env=env,
                                 ready_timeout_s=ready_timeout_s)
        log = self.log_dir / f"{plan.role}-{where.resolved.node.short_id}-{plan.port}.log"
        return RemoteEngine(self.session, where, plan, log, env, ready_timeout_s)


async def _echo(proc: RemoteEngine, out: TextIO) -> None:
    """Copy the engine's log here as it grows on the node (secrets redacted there)."""
    offset = 0
    while True:
        text, offset = await proc.session.call(proc.placed, "log_since", proc.key, offset)
        if text:
            out.write(text)
            out.flush()
        await asyncio.sleep(ECHO_POLL_S)


async def _start(proc: EngineProcess) -> None:
    if isinstance(proc, RemoteEngine):
        await proc.start_remote()
    else:
        proc.start()


async def _stop(proc: EngineProcess) -> None:
    if isinstance(proc, RemoteEngine) and proc.pid is None:
        return
    try:
        await proc.stop()
    except KvlabError:  # its node or agent is gone: Ray ends the agent, and the engine with it
        return


def _named(proc: EngineProcess) -> str:
    node = f"@{proc.placed.name}" if isinstance(proc, RemoteEngine) else "@here"
    return f"{proc.plan.role}:{proc.plan.port}{node}"


async def lost(procs: list[EngineProcess]) -> str | None:
    """One line naming the first engine that stopped (node and role), else None."""
    for proc in procs:
        if isinstance(proc, RemoteEngine):
            if proc.stopped:
                continue
            try:
                code = await proc.poll()
            except KvlabError as exc:
                return f"{proc.where} was lost: {exc}"
            if code is not None:
                with contextlib.suppress(KvlabError):
                    await proc.ship()
                return (f"{proc.where} stopped serving during the run (exit {code}); its log, "
                        f"shipped to {proc.log_path}: {_tail(proc)}")
        elif proc.returncode is not None:
            return (f"{proc.plan.engine} ({proc.plan.role}) here stopped during the run (exit "
                    f"{proc.returncode}); {proc.log_path}: {_tail(proc)}")
    return None


def _tail(proc: EngineProcess) -> str:
    lines = [ln.strip() for ln in proc.log_text().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln and "Traceback" not in ln]
    return (errors[0] if errors else " | ".join(lines[-2:]) or "(empty log)")[-300:]


@contextlib.asynccontextmanager
async def watched(procs: list[EngineProcess], every_s: float = WATCH_S) -> AsyncIterator[None]:
    """While inside, an engine that stops (or whose node goes) cancels the step, which then
    ends with one EngineError naming node and role; also checked once more at the end."""
    task = asyncio.current_task()
    found: list[str] = []

    async def watch() -> None:
        while not found:
            await asyncio.sleep(every_s)
            line = await lost(procs)
            if line is not None and task is not None:
                found.append(line)
                task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not found or task is None:
            raise
        task.uncancel()
        raise EngineError(found[0]) from None
    except Exception as exc:
        if found and task is not None:
            task.uncancel()  # the step turned the watcher's cancel into its own error
        line = found[0] if found else await lost(procs)
        if line is not None:
            raise EngineError(line) from exc
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    line = found[0] if found else await lost(procs)
    if line is not None:
        raise EngineError(line)


class NodeReader:
    """The counters of the nodes a step's roles run on."""

    def __init__(self, roles: dict[str, Placed], store: str = "") -> None:
        self.roles, self.store = roles, store

    def read(self) -> Reading:
        """Every role's node counters, now (blocking, bounded)."""
        names = list(self.roles)
        refs = [self.roles[r].agent.counters.remote(self.roles[r].iface or "", self.store)
                for r in names]
        try:
            found = ray.get(refs, timeout=READ_TIMEOUT_S)
        except ray.exceptions.RayError as exc:
            raise EngineError(f"reading the nodes' counters failed: "
                              f"{str(exc).splitlines()[0][:200]}") from None
        return dict(zip(names, found, strict=True))

    def delta(self, before: Reading, after: Reading) -> dict[str, NodeCounters]:
        return {role: _delta(self.roles[role].name, before[role], after[role])
                for role in after}

    def writer(self, write: Callable[[Record], object]) -> Callable[[Record], object]:
        """`write`, with each load row and the link row carrying the nodes' deltas."""
        first = last = self.read()

        def wrapped(line: Record) -> object:
            nonlocal last
            if isinstance(line, LoadRecord):
                now = self.read()
                line.node_counters = self.delta(last, now)
                last = now
            elif isinstance(line, LinkRecord):
                line.node_counters = self.delta(first, self.read())
            return write(line)

        return wrapped


def _minus(after: int | None, before: int | None) -> int | None:
    return after - before if after is not None and before is not None else None


def _delta(node: str, before: Counters, after: Counters) -> NodeCounters:
    rdma = netdev.rdma_delta(before.rdma, after.rdma)
    return NodeCounters(node=node, iface=after.iface or None,
                        rx_bytes=_minus(after.rx_bytes, before.rx_bytes),
                        tx_bytes=_minus(after.tx_bytes, before.tx_bytes),
                        rdma_rx_bytes=rdma.rx_bytes if rdma else None,
                        rdma_tx_bytes=rdma.tx_bytes if rdma else None,
                        store_bytes=_minus(after.store_bytes, before.store_bytes))
