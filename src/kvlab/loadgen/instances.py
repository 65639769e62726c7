"""The engines behind a load run's URL, as each states itself when the run begins.

Every load and link row names the engines it measured (`EngineLine`): the one instance
behind the URL, or, behind kvlab's proxy, each leg its /health names. Each is asked what it
is (`kvlab check`'s probe: its engine, its prefix caching, its memory fraction from its own
/metrics), and an instance on this machine is known by its process (session and start time,
`engines/local.instance_id`), which finds its own `startup` line in the notebook: its
effective arguments come from there (the engine's startup log), else from its command line.
What the row then says about the connector and the memory fraction is what the instances
ran, not what the settings say; a fact no instance states keeps the caller's value.

Deliberately not here: comparing two runs' engines (`measure/compare.py` does, from these
lines).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import httpx

from kvlab.core import KvlabError, server_root
from kvlab.engines import known_engine, local
from kvlab.loadgen import topology
from kvlab.loadgen.spec import LoadSpec
from kvlab.measure import probe
from kvlab.records import EngineLine, RunContext, StartupRecord, notebook


def startups_by_instance(labbook: str) -> dict[str, StartupRecord]:
    """The notebook's startup lines by their process's identity (the newest wins)."""
    if not labbook or not Path(labbook).exists():
        return {}
    return {r.instance: r for r in notebook.read(labbook).records
            if isinstance(r, StartupRecord) and r.instance}


async def engines_behind(base_url: str, labbook: str, api_key: str = "") -> list[EngineLine]:
    """Each engine behind `base_url`: its legs behind kvlab's proxy, else the URL itself."""
    legs = await asyncio.to_thread(topology.proxy_legs, base_url, api_key)
    roles = [(role, url) for role in ("prefill", "decode") for url in legs.get(role, [])] \
        or [("instance", base_url)]
    startups = startups_by_instance(labbook)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(timeout=10.0, trust_env=False, headers=headers) as client:
        return [await _engine(client, role, url, startups) for role, url in roles]


async def _engine(client: httpx.AsyncClient, role: str, url: str,
                  startups: dict[str, StartupRecord]) -> EngineLine:
    root = server_root(url)
    line = EngineLine(role=role, url=root, instance=local.listening_instance(root))
    try:
        facts = await probe(client, url)
    except KvlabError:
        return line
    line.engine, line.prefix_caching = facts.engine, facts.prefix_caching
    line.memory_fraction = facts.memory_fraction
    started = startups.get(line.instance) if line.instance else None
    if started is not None:
        line.startup = f"{started.label} at {started.recorded_at}"
    engine = known_engine(facts.engine) if facts.engine else None
    if engine is not None:
        argv = local.listening_argv(root) if line.instance else None
        line.args = (started.engine_args if started is not None and started.engine_args
                     else engine.effective_args(None, argv))
        if line.args is not None:
            line.connector = engine.connector_of(line.args)[0]
    return line


def stated(context: RunContext, engines: list[EngineLine]) -> RunContext:
    """`context` with the engines it measured, and the connector and memory fraction they
    ran with where every one states it (a split's connector is its decode leg's)."""
    out = context.model_copy(deep=True)
    out.engines = engines
    readers = [e for e in engines if e.role in ("instance", "decode")]
    connectors = {e.connector for e in readers}
    if readers and None not in connectors and len(connectors) == 1:
        out.connector = connectors.pop()
    fractions = {e.memory_fraction for e in engines}
    if engines and None not in fractions and len(fractions) == 1:
        out.memory_fraction = fractions.pop()
    return out


async def with_engines(spec: LoadSpec, api_key: str = "") -> LoadSpec:
    """`spec` with its context stating the engines behind its URL (once: a spec that already
    states them is returned as it is)."""
    if spec.context.engines is not None:
        return spec
    engines = await engines_behind(spec.base_url, spec.labbook, api_key)
    return replace(spec, context=stated(spec.context, engines))
