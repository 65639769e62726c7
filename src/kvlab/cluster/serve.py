"""`kvlab serve ROLE --node NAME`: one engine in the foreground, on a Ray node.

The same plan `kvlab serve` would start here, bound to the node's address on the role's port
(PREFILL_PORT, DECODE_PORT, `--port`), checked on the node (engine and model paths), started
by the node's agent through the run's `RayHost` (its log echoed here as it grows, its
`startup` line written here once it is ready), and stopped, with the agent, when kvlab stops
(Ctrl-C, SIGTERM, SIGHUP, or kvlab's own death: the agent dies with it and takes the engine
along). It never outlives kvlab, so there is no `--detach` on a node.

An engine on a node listens beyond loopback, so it needs a key: the one LOADTEST_API_KEY_ENV
names (the key its clients, the proxy and the load generator, send). A key generated here would
lock everyone else out, so none is: serving without one is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

from kvlab.cluster.placement import Placement, rebind
from kvlab.cluster.runner import RayHost, RemoteEngine
from kvlab.cluster.session import ClusterSession
from kvlab.core import SettingError, Settings
from kvlab.engines import EnginePlan, Scope
from kvlab.records import serve_label

POLL_S = 1.0


def require_key(settings: Settings) -> None:
    if not settings.api_key():
        name = settings.loadtest_api_key_env or "LOADTEST_API_KEY_ENV"
        raise SettingError(
            f"an engine on a Ray node listens on the node's address, beyond loopback: export "
            f"the key its clients will send in {name} (LOADTEST_API_KEY_ENV names the "
            "variable); kvlab passes it to the engine and never writes it down")


@contextlib.asynccontextmanager
async def on_node(scope: Scope, plan: EnginePlan, placement: Placement,
                  ended: list[int | None]) -> AsyncIterator[RemoteEngine]:
    """`plan` running on its node, ready and recorded, until the block ends (then stopped);
    `ended` gets the engine's exit code however it ends."""
    settings = scope.settings
    require_key(settings)
    session = ClusterSession(placement, settings, scope.run_id)
    try:
        await session.open()
        placed = session.where(plan.role)
        assert placed is not None, "every engine role has a node on a cluster"
        host = RayHost(scope, session, settings.paths().logs, echo=sys.stderr)
        # on the node's address, on the role's own port (place() keeps a bound plan's port)
        bound = rebind(plan, placed.address, plan.port)
        proc: RemoteEngine | None = None
        try:
            label = serve_label(plan.role, plan.host_tier)
            async with host.running([bound], [label]) as (started,):
                assert isinstance(started, RemoteEngine)
                proc = started
                yield started
        finally:
            ended.append(proc.returncode if proc is not None else None)
    finally:
        await asyncio.shield(session.close())


async def exited(proc: RemoteEngine) -> int:
    """Wait for the engine to exit by itself (it runs in the foreground); its exit code."""
    while True:  # the agent is polled: the process is another machine's
        code = await proc.poll()
        if code is not None:
            return code
        await asyncio.sleep(POLL_S)
