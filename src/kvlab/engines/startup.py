"""The `startup` notebook record: what an instance said about its KV capacity as it started.

The labs ask for each instance's KV cache size and maximum concurrency from its startup log;
this turns a started engine's log into that record, dispatching on the engine.
"""

from __future__ import annotations

import re
from typing import Any

from kvlab.engines import vllm
from kvlab.engines.plan import EnginePlan
from kvlab.records import notebook

_LLAMA_SLOTS = re.compile(r"n_slots = (\d+), n_ctx_slot = (\d+)")
_PD_ROLES = ("baseline", "prefill", "decode", "proxy")


def capacity(plan: EnginePlan, log_text: str) -> dict[str, Any]:
    """KV capacity fields parsed from the engine's startup log (empty if none were found)."""
    if plan.engine == "vllm":
        return vllm.parse_startup(log_text).as_dict()
    if m := _LLAMA_SLOTS.search(log_text):
        slots, per_slot = int(m.group(1)), int(m.group(2))
        return {"slots": slots, "tokens_per_slot": per_slot, "kv_cache_tokens": slots * per_slot,
                "lines": [m.group(0)]}
    return {}


def lab_for(role: str) -> str:
    return notebook.LAB_PD if role in _PD_ROLES else notebook.LAB_OFFLOAD


def record(plan: EnginePlan, log_text: str, *, ready_s: float | None, engine_version: str,
           label: str | None = None, lab: str | None = None, **extra: Any) -> dict[str, Any]:
    """A `startup` notebook record for one instance."""
    cap = capacity(plan, log_text)
    return notebook.envelope(
        "startup", label or plan.label_hint or plan.role, lab or lab_for(plan.role),
        engine=plan.engine, engine_version=engine_version, role=plan.role, model=plan.model,
        served_name=plan.served_name, base_url=plan.base_url, argv=plan.argv(),
        ready_s=round(ready_s, 2) if ready_s is not None else None,
        capacity=cap, **extra,
    )


async def server_version(plan: EnginePlan) -> str:
    """The running server's own version: vLLM's /version, llama-server's /props build_info."""
    import httpx

    path = "/version" if plan.engine == "vllm" else "/props"
    try:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            response = await client.get(plan.base_url + path)
            body = response.json()
    except (httpx.HTTPError, ValueError):
        return "unknown"
    if plan.engine == "vllm":
        return str(body.get("version", "unknown"))
    return str(body.get("build_info", "unknown"))
