"""`kvlab serve ROLE --node NAME`: one engine in the foreground, on a Ray node.

The same plan `kvlab serve` would start here, bound to the node's address on the role's port
(PREFILL_PORT, DECODE_PORT, `--port`), checked on the node (engine and model paths), started
by the node's agent, its log echoed here as it grows, its `startup` line written here once it
is ready, and stopped, with the agent, when kvlab stops (Ctrl-C, SIGTERM, SIGHUP, or kvlab's
own death: the agent dies with it and takes the engine along). It never outlives kvlab, so
there is no `--detach` on a node.

An engine on a node listens beyond loopback, so it needs a key: the one LOADTEST_API_KEY_ENV
names (the key its clients, the proxy and the load generator, send). A key generated here would
lock everyone else out, so none is: serving without one is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, TextIO

from kvlab.cluster.placement import Placement, rebind
from kvlab.cluster.runner import RemoteEngine, secret_env
from kvlab.cluster.session import ClusterSession
from kvlab.core.errors import SettingError
from kvlab.core.settings import Settings
from kvlab.engines import startup
from kvlab.engines.plan import EnginePlan
from kvlab.engines.process import DEFAULT_READY_TIMEOUT_S
from kvlab.records import notebook

POLL_S = 1.0


def require_key(settings: Settings) -> None:
    if not settings.api_key():
        name = settings.loadtest_api_key_env or "LOADTEST_API_KEY_ENV"
        raise SettingError(
            f"an engine on a Ray node listens on the node's address, beyond loopback: export "
            f"the key its clients will send in {name} (LOADTEST_API_KEY_ENV names the "
            "variable); kvlab passes it to the engine and never writes it down")


async def serve_on_node(settings: Settings, plan: EnginePlan, placement: Placement,
                        log_path: Path, echo: TextIO,
                        ended: dict[str, Any] | None = None) -> dict[str, Any]:
    """Serve `plan` on its node until it exits or this task is cancelled (then stop it);
    `ended` gets the engine's exit code however it ends."""
    require_key(settings)
    session = ClusterSession(placement, settings, time.strftime("serve-%Y%m%d-%H%M%S"))
    try:
        await session.open()
        placed = session.where(plan.role)
        assert placed is not None, "every engine role has a node on a cluster"
        plan = rebind(plan, placed.address, plan.port)
        await session.check_paths([plan])
        proc = RemoteEngine(session, placed, plan, log_path,
                            secret_env(settings, plan, session), DEFAULT_READY_TIMEOUT_S)
        await proc.start_remote()
        tail = asyncio.create_task(_echo(proc, echo))
        try:
            await proc.wait_ready()
            recorded = await _record(settings, proc, echo)
            code = await _exited(proc)
        finally:
            tail.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tail
            await asyncio.shield(_stop(proc))
            if ended is not None:
                ended["exit_code"] = proc.returncode
        return {**recorded, "exit_code": code, "node": placed.describe(), "log": str(log_path)}
    finally:
        await asyncio.shield(session.close())


async def _exited(proc: RemoteEngine) -> int:
    """Wait for the engine to exit by itself (it runs in the foreground); its exit code."""
    while True:  # the agent is polled: the process is another machine's
        code = await proc.poll()
        if code is not None:
            return code
        await asyncio.sleep(POLL_S)


async def _stop(proc: RemoteEngine) -> None:
    if proc.pid is not None and not proc.stopped:
        await proc.stop()


async def _echo(proc: RemoteEngine, out: TextIO) -> None:
    """Copy the engine's log here as it grows on the node (secrets redacted there)."""
    offset = 0
    while True:
        text, offset = await proc.session.call(proc.placed, "log_since", proc.key, offset)
        if text:
            out.write(text)
            out.flush()
        await asyncio.sleep(POLL_S)


async def _record(settings: Settings, proc: RemoteEngine, out: TextIO) -> dict[str, Any]:
    version = await startup.server_version(proc.plan)
    line = startup.record(proc.plan, proc.log_text(), ready_s=proc.ready_s,
                          engine_version=version, node=proc.placed.describe())
    notebook.append(settings.labbook, line)
    print(f"\n==> ready after {proc.ready_s or 0:.1f} s at {proc.plan.base_url} on node "
          f"{proc.placed.name}; startup line appended to {settings.labbook}. Ctrl-C stops it.",
          file=out)
    return {"startup": line.capacity, "ready_s": proc.ready_s, "base_url": proc.plan.base_url}
