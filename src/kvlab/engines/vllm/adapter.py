"""vLLM as kvlab's `Engine`: the evidence tables, startup capacity and identity probes.

Every answer comes from `facts.py` (names and formats pinned there) or from the running
server: `/version`, the `vllm:cache_config_info` labels on `/metrics`, and `/tokenize` of the
compatibility check's probe conversation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvlab.engines.base import (
    PROBE_MESSAGES,
    VLLM,
    InstanceFacts,
    LaunchSettings,
    TwoEndpointProof,
    launch_settings_from,
)
from kvlab.engines.http import get_json, post_json
from kvlab.engines.vllm import facts

if TYPE_CHECKING:
    import httpx

    from kvlab.engines.plan import EnginePlan
    from kvlab.observe.metrics import Snapshot



class VllmEngine:
    name = VLLM
    metric_namespace = "vllm"
    counters = facts.EVIDENCE_COUNTERS
    gauges = facts.EVIDENCE_GAUGES
    transfer_counters = facts.TRANSFER_COUNTERS
    two_endpoint_proof: TwoEndpointProof | None = None  # the generic cases suit its connectors

    def capacity(self, plan: EnginePlan, log_text: str) -> dict[str, Any]:
        return facts.parse_startup(log_text).as_dict()

    def launch_settings(self, argv: list[str]) -> LaunchSettings:
        return launch_settings_from(argv, (facts.CONTEXT_FLAG,), facts.MEMORY_FRACTION_FLAG)

    def block_size(self, platform: str) -> int:
        return facts.CPU_BLOCK_SIZE if platform == "cpu" else facts.GPU_BLOCK_SIZE

    async def version(self, client: httpx.AsyncClient, root: str) -> str | None:
        body = await get_json(client, root + facts.VERSION_PATH)
        return str(body["version"]) if body and "version" in body else None

    async def describe(self, client: httpx.AsyncClient, root: str, facts_out: InstanceFacts,
                       snap: Snapshot | None) -> bool:
        version = await self.version(client, root)
        if version is None and (snap is None or snap.engine() is not self):
            return False
        facts_out.engine, facts_out.version = VLLM, version
        if snap is not None:
            _cache_config(snap, facts_out)
        tokens = await post_json(client, root + facts.TOKENIZE_PATH, {
            "model": facts_out.model_id, "messages": PROBE_MESSAGES,
            "add_generation_prompt": True})
        if tokens and "tokens" in tokens:
            facts_out.template_tokens = [int(t) for t in tokens["tokens"]]
        return True


def _cache_config(snap: Snapshot, out: InstanceFacts) -> None:
    info = facts.CACHE_CONFIG_INFO
    block = snap.label_value(info, "block_size")
    out.block_size = int(block) if block and block.isdigit() else None
    out.cache_dtype = snap.label_value(info, "cache_dtype")
    caching = snap.label_value(info, "enable_prefix_caching")
    out.prefix_caching = None if caching is None else caching == "True"
    size = snap.label_value(info, "kv_cache_size_tokens")
    out.kv_cache_tokens = int(size) if size and size.isdigit() else None


VLLM_ENGINE = VllmEngine()
