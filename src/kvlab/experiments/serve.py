"""One engine in the foreground, as the seed's serve scripts run it (`kvlab serve`, `kvlab
llama serve`, and `kvlab serve --node` on a Ray node).

The engine starts through an engine host (`engines/host.py`: this machine's, or the node's),
which writes its `startup` line once it is ready; then the running engine is asked what it
reports itself (context, block size, KV cache), and the engine runs until it exits or a stop
signal arrives: Ctrl-C, SIGTERM or SIGHUP (a script's background job ignores Ctrl-C; a closed
terminal sends SIGHUP) stop its whole process group. The result says who ended it and how,
with the exit status a shell would see (128 + N for a signal N). `detach` returns once the
engine is ready and leaves it running (`kvlab clean` stops it); an engine on a node never
outlives kvlab, so there is no detaching there.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvlab.cluster.placement import Placement
from kvlab.core import KvlabError, Settings
from kvlab.engines import EnginePlan, EngineProcess, LocalHost, death_cause
from kvlab.measure import probe
from kvlab.records import KvCapacity, NodeInfo, StartupRecord, notebook, serve_label

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
POLL_S = 1.0


@dataclass
class Served:
    """How a foreground engine ran and ended."""

    plan: EnginePlan
    log: Path
    startup: KvCapacity | None = None
    ready_s: float | None = None
    reported: dict[str, str | int] = field(default_factory=dict)
    exit_code: int | None = None
    exit_status: int = 0
    stopped_by: str | None = None
    outcome: str = ""
    pid: int | None = None  # a detached engine's process group
    node: NodeInfo | None = None


@dataclass
class LabbookScope:
    """A single engine's scope: its startup line goes to LABBOOK (and `lines`); what it
    says, to stderr."""

    settings: Settings
    run_id: str
    lines: list[StartupRecord] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(text, file=sys.stderr)

    def record(self, line: StartupRecord) -> object:
        notebook.append(self.settings.labbook, line)
        self.lines.append(line)
        return line


SERVE_PREFIX = "serve-"


def serve_log(settings: Settings, plan: EnginePlan) -> Path:
    """Where a foreground engine's log goes (`kvlab llama` finds a server's log there)."""
    return settings.paths().log(f"{SERVE_PREFIX}{plan.role}-{plan.port}")


async def serve_here(settings: Settings, plan: EnginePlan, *, detach: bool = False) -> Served:
    """`plan` on this machine until it exits or a stop signal; with `detach`, until ready."""
    plan = plan.with_secrets(settings.known_secrets())
    scope = LabbookScope(settings, time.strftime("serve-%Y%m%d-%H%M%S"))
    host = LocalHost(scope, settings.paths().logs, echo=sys.stderr, detached=detach,
                     log_prefix=SERVE_PREFIX)
    served = Served(plan, serve_log(settings, plan))
    received: list[int] = []
    with _stopped_by_signals(received), _our_cancel(received):
        async with host.running([plan], [serve_label(plan.role, plan.host_tier)]) as (proc,):
            await _ready(served, proc, scope, "`kvlab clean` stops it" if detach
                         else "Ctrl-C stops it")
            if not detach:
                await proc.wait_exit()
            served.pid = proc.pid
    code = host.started[0].returncode if host.started else None
    ended = _ended(served, code, received, detach, exit_status(code))
    if host.started and not received and code is not None:
        cause = death_cause(host.started[0])
        ended.outcome = outcome(plan, code, received, cause)
        ended.exit_status = status_of(code, cause)
    return ended


async def serve_on_node(settings: Settings, plan: EnginePlan, placement: Placement) -> Served:
    """`plan` on its Ray node until it exits or a stop signal (`cluster/serve.py`)."""
    from kvlab.cluster import serve

    plan = plan.with_secrets(settings.known_secrets())
    scope = LabbookScope(settings, time.strftime("serve-%Y%m%d-%H%M%S"))
    served = Served(plan, serve_log(settings, plan))
    received: list[int] = []
    ended: list[int | None] = []
    with _stopped_by_signals(received), _our_cancel(received):
        async with serve.on_node(scope, plan, placement, ended) as proc:
            served.node, served.log = proc.placed.describe(), proc.log_path
            await _ready(served, proc, scope, "Ctrl-C stops it")
            await serve.exited(proc)
    code = ended[0] if ended else None
    # the engine's own status cannot be read on a node once its agent stopped it: the signal's
    served = _ended(served, code, received, False,
                    128 + received[0] if received else exit_status(code))
    target = placement.target(plan.role)
    served.outcome += f" (on node {target[1] if target else 'unknown'})"
    return served


async def _ready(served: Served, proc: EngineProcess, scope: LabbookScope, stop: str) -> None:
    """What the ready engine's startup line and the engine itself say."""
    served.startup = scope.lines[-1].capacity if scope.lines else None
    served.ready_s = proc.ready_s
    on = f" on node {served.node.node}" if served.node else ""
    scope.say(f"\n==> ready after {proc.ready_s or 0:.1f} s at {proc.plan.base_url}{on}; "
              f"startup line appended to {scope.settings.labbook}. {stop}.")
    served.reported = await engine_reports(proc.plan.base_url, scope.settings.api_key())
    if served.reported:
        scope.say("    the engine reports: "
                  + ", ".join(f"{k} {v}" for k, v in served.reported.items()))


async def engine_reports(base_url: str, api_key: str = "") -> dict[str, str | int]:
    """Context, block size and KV cache size as the running engine states them (what the
    summary printed before start could only take from the plan)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with httpx.AsyncClient(timeout=10.0, trust_env=False, headers=headers) as client:
            facts = await probe(client, base_url)
    except KvlabError:
        return {}
    shown = {"context": facts.max_model_len, "block size": facts.block_size,
             "KV cache tokens": facts.kv_cache_tokens, "KV type": facts.cache_dtype}
    return {k: v for k, v in shown.items() if v is not None}


def _ended(served: Served, code: int | None, received: list[int], detach: bool,
           status: int) -> Served:
    plan = served.plan
    if detach and code is None:
        served.outcome = (f"{plan.engine} ({plan.role}) left running as process group "
                          f"{served.pid}; `kvlab clean` stops it")
        return served
    served.pid = None
    served.exit_code = code
    served.exit_status = status
    served.stopped_by = signal_name(received[0]) if received else None
    served.outcome = outcome(plan, code, received)
    return served


def exit_status(code: int | None) -> int:
    """A process's exit as a shell reports it: its code, or 128 + N when signal N ended it."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def status_of(code: int | None, cause: str | None) -> int:
    """kvlab's exit status for an engine that ended by itself: its own, or 1 where it exited 0
    with an exception in its log (it died, whatever its code says)."""
    status = exit_status(code)
    return 1 if cause and status == 0 else status


def outcome(plan: EnginePlan, code: int | None, received: list[int],
            cause: str | None = None) -> str:
    """One line: who ended the engine, how it exited, and why where its log says. "Exited by
    itself" only for an exit 0 whose log shows no exception: vLLM's API server exits 0
    after its engine core died, so a cause in the log makes it a death whatever the code."""
    what = f"{plan.engine} ({plan.role})"
    if received:
        return f"stopped on {signal_name(received[0])}: {what} ended ({_how(code)})"
    status = status_of(code, cause)
    if cause:
        return f"{what} died ({_how(code)}, status {status}): {cause}"
    if code is not None and code < 0:
        return (f"{what} was killed by {signal_name(-code)} from outside kvlab (status "
                f"{status}); its log names no cause (the kernel's OOM killer sends SIGKILL)")
    if code == 0:
        return f"{what} exited by itself (exit 0, status 0); its log shows no error"
    return f"{what} died ({_how(code)}, status {status}); its log names no cause: see it"


def _how(code: int | None) -> str:
    return f"killed by {signal_name(-code)}" if code is not None and code < 0 else f"exit {code}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextlib.contextmanager
def _our_cancel(received: list[int]) -> Iterator[None]:
    """A cancel our own stop signal caused is handled (the engine is stopped by then)."""
    try:
        yield
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not received or task is None:
            raise
        task.uncancel()


@contextlib.contextmanager
def _stopped_by_signals(received: list[int]) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP cancel the current task (so `async with` stops the
    engine, as Ctrl-C does) and are noted in `received`."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if not received and task is not None:
            task.cancel()
        received.append(signum)

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
