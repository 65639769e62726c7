"""llama.cpp's llama-server as kvlab's `Engine`: evidence tables, slot capacity, identity.

Answers come from `facts.py` (endpoints, /props keys, metric names) and the running server.
llama-server reuses a prompt prefix token by token, so its block size is 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvlab.engines.base import (
    LLAMA_CPP,
    PROBE_MESSAGES,
    CounterTable,
    InstanceFacts,
    LaunchSettings,
    TwoEndpointProof,
    launch_settings_from,
)
from kvlab.engines.http import get_json, post_json
from kvlab.engines.llamacpp import facts
from kvlab.engines.llamacpp.prove import slot_store_proof

if TYPE_CHECKING:
    import httpx

    from kvlab.engines.plan import EnginePlan
    from kvlab.observe.metrics import Snapshot



class LlamaCppEngine:
    name = LLAMA_CPP
    metric_namespace = "llamacpp"
    counters = facts.EVIDENCE_COUNTERS
    gauges = facts.EVIDENCE_GAUGES

    def __init__(self) -> None:
        self.transfer_counters: CounterTable = {}  # llama-server moves no KV between instances
        # two llama-servers share KV only through a slot file moved between them
        self.two_endpoint_proof: TwoEndpointProof | None = slot_store_proof

    def capacity(self, plan: EnginePlan, log_text: str) -> dict[str, Any]:
        m = facts.STARTUP_SLOTS_LINE.search(log_text)
        if m is None:
            return {}
        slots, per_slot = int(m.group(1)), int(m.group(2))
        return {"slots": slots, "tokens_per_slot": per_slot, "kv_cache_tokens": slots * per_slot,
                "lines": [m.group(0)]}

    def launch_settings(self, argv: list[str]) -> LaunchSettings:
        return launch_settings_from(argv, facts.CONTEXT_FLAGS, None)  # no memory fraction

    def block_size(self, platform: str) -> int:
        return 1

    async def version(self, client: httpx.AsyncClient, root: str) -> str | None:
        props = await get_json(client, root + facts.PROPS_PATH)
        return str(props.get(facts.PROPS_BUILD, "unknown")) if props else None

    async def describe(self, client: httpx.AsyncClient, root: str, facts_out: InstanceFacts,
                       snap: Snapshot | None) -> bool:
        out = facts_out
        props = await get_json(client, root + facts.PROPS_PATH)
        if not props:
            return False
        out.engine = LLAMA_CPP
        out.version = str(props.get(facts.PROPS_BUILD, "unknown"))
        out.root = str(props.get(facts.PROPS_MODEL_PATH, out.root))
        slot_ctx = (props.get("default_generation_settings") or {}).get(facts.SLOT_N_CTX)
        out.max_model_len = int(slot_ctx) if slot_ctx else out.max_model_len
        out.block_size = 1
        out.prefix_caching = True
        out.template_tokens = await _template_tokens(client, root)
        return True


async def _template_tokens(client: httpx.AsyncClient, root: str) -> list[int] | None:
    template = await post_json(client, root + facts.APPLY_TEMPLATE_PATH,
                               {"messages": PROBE_MESSAGES})
    if not template or "prompt" not in template:
        return None
    tokens = await post_json(client, root + facts.TOKENIZE_PATH,
                             {"content": template["prompt"], "parse_special": True})
    return [int(t) for t in tokens["tokens"]] if tokens and "tokens" in tokens else None


LLAMA_CPP_ENGINE = LlamaCppEngine()
