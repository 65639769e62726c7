"""The `startup` notebook record: what an instance said about its KV capacity as it started.

The labs ask for each instance's KV cache size and maximum concurrency from its startup log;
this turns a started engine's log into that record, through the engine's adapter (an LMCache
server's from its /status), and adds what the plan says kvlab chose (which build and why, the
flags it added, host figures).
"""

from __future__ import annotations

from kvlab.engines.base import LaunchSettings
from kvlab.engines.plan import EnginePlan
from kvlab.engines.registry import known_engine
from kvlab.engines.vllm import lmcache
from kvlab.records import KvCapacity, NodeInfo, StartupRecord, leg_of, notebook

_PD_ROLES = ("baseline", "prefill", "decode", "proxy")


def capacity(plan: EnginePlan, log_text: str) -> KvCapacity:
    """KV capacity fields parsed from the engine's startup log (empty if none were found)."""
    engine = known_engine(plan.engine)
    return engine.capacity(plan, log_text) if engine is not None else KvCapacity()


def lab_for(role: str) -> str:
    return notebook.LAB_PD if leg_of(role)[0] in _PD_ROLES else notebook.LAB_OFFLOAD


def record(plan: EnginePlan, log_text: str, *, ready_s: float | None, engine_version: str,
           label: str, lab: str | None = None, node: NodeInfo | None = None,
           instance: str | None = None) -> StartupRecord:
    """A `startup` notebook record for one instance, with what kvlab chose while planning
    it (`plan.startup_facts`: the build and why, flags beyond the seed's, host figures), its
    effective arguments as the engine stated them, and (`instance`) who its process is."""
    engine = known_engine(plan.engine)
    sized = engine.launch_settings(plan.argv()) if engine is not None else LaunchSettings()
    line = StartupRecord(
        label=label, lab=lab or lab_for(plan.role), engine=plan.engine,
        engine_version=engine_version, role=plan.role, model=plan.model,
        served_name=plan.served_name, base_url=plan.base_url, argv=plan.argv(),
        ready_s=round(ready_s, 2) if ready_s is not None else None,
        capacity=capacity(plan, log_text), context_tokens=sized.context_tokens,
        memory_fraction=sized.memory_fraction, node=node, instance=instance,
        engine_args=engine.effective_args(log_text, plan.argv()) if engine is not None
        else None,
        version_note=engine.version_note(engine_version) if engine is not None else None)
    return line.overlay(plan.startup_facts)


async def server_version(plan: EnginePlan) -> str:
    """The running server's own version, as its engine (or LMCache's server) reports it
    ("unknown" if it does not)."""
    import httpx

    engine = known_engine(plan.engine)
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        if plan.engine == lmcache.ENGINE:
            return await lmcache.version(client, plan.base_url) or "unknown"
        if engine is None:
            return "unknown"
        return await engine.version(client, plan.base_url) or "unknown"


async def server_capacity(plan: EnginePlan) -> KvCapacity | None:
    """What a cache server that is no engine holds, as it says (LMCache's /status: its L1);
    None for anything else."""
    import httpx

    if plan.engine != lmcache.ENGINE:
        return None
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        found = await lmcache.held(client, plan.base_url)
    if found is None:
        return None
    return KvCapacity(kv_cache_bytes=found.capacity_bytes, lines=[
        f"LMCache /status: L1 {(found.capacity_bytes or 0) / 2**30:.3g} GiB, "
        f"{found.objects} objects, chunks of {found.chunk_tokens} tokens"])
