"""An engine kept between two steps of a pass (`engines/reuse.py`), on the real engines: the
second step's startup line says it was kept and how its reset was checked, and the first
step's prompt, sent again in the second step, misses (read from the engine's cached tokens);
where a reset cannot empty the whole cache (llama-server's RAM cache on), a fresh engine starts
instead."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from integration.conftest import cpu_settings
from kvlab.engines import PlanRequest, llamacpp, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.engines.reuse import EnginePool
from kvlab.experiments.lab import Lab, engines
from kvlab.records import notebook
from kvlab.records.models import StartupRecord


async def _cached(base_url: str, model: str, prompt: str) -> int:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        got = (await client.post(base_url + "/v1/completions", json=body)).raise_for_status()
    details = got.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


@pytest.mark.vllm
async def test_a_kept_vllm_answers_the_previous_steps_prompt_as_a_miss(
        tmp_path: Path, tiny_models: TinyModels, vllm_install: vllm.VllmInstall) -> None:
    settings = cpu_settings(model=tiny_models.hf, labbook=str(tmp_path / "book.md"),
                            kvlab_home=str(tmp_path / "home"))
    lab = Lab(settings, pool=EnginePool())
    prompt = f"step one {secrets.token_hex(4)} " + "a long shared preamble " * 80

    def plan() -> EnginePlan:
        return vllm.plan(settings, "baseline", vllm_install, PlanRequest(port=free_port()))

    try:
        async with engines(lab, [plan()], labels=["step-one"]) as (first,):
            url = first.plan.base_url
            await _cached(url, settings.served_name, prompt)
            assert await _cached(url, settings.served_name, prompt) > 0  # it does cache
        async with engines(lab, [plan()], labels=["step-two"]) as (second,):
            assert second is first and second.plan.base_url == url  # kept, not restarted
            assert await _cached(url, settings.served_name, prompt) == 0  # a miss
    finally:
        assert lab.pool is not None
        await lab.pool.close()
    assert first.returncode is not None  # stopped at the end of the pass
    lines = {r.label: r for r in notebook.read(settings.labbook).of(StartupRecord)}
    reused = lines["step-two"].reused
    assert lines["step-one"].reused is None and reused is not None
    assert reused.started_as == "step-one" and reused.start_ready_s == lines["step-one"].ready_s
    assert reused.probe.cached_before > 0 and reused.probe.cached_after == 0
    assert reused.probe.method == "POST /reset_prefix_cache?reset_external=true"
    assert lines["step-two"].ready_s == round(reused.probe.reset_s, 2)


@pytest.mark.llama
@pytest.mark.parametrize(("cache_ram", "kept"), [(0, True), (64, False)])
async def test_llama_server_is_kept_only_with_its_ram_cache_off(
        tmp_path: Path, tiny_models: TinyModels, llama_binary: Path, cache_ram: int,
        kept: bool) -> None:
    settings = cpu_settings(llama_model=tiny_models.gguf, labbook=str(tmp_path / "book.md"),
                            llama_slot_save_path=str(tmp_path / "slots"))
    lab = Lab(settings, pool=EnginePool(min_start_s=0.0))  # its half-second start is kept too

    def plan() -> EnginePlan:
        return llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(
            port=free_port(), cache_ram_mib=cache_ram))

    try:
        async with engines(lab, [plan()], labels=["step-one"]) as (first,):
            pass
        async with engines(lab, [plan()], labels=["step-two"]) as (second,):
            assert (second is first) is kept
    finally:
        assert lab.pool is not None
        await lab.pool.close()
    lines = {r.label: r for r in notebook.read(settings.labbook).of(StartupRecord)}
    reused = lines["step-two"].reused
    if kept:
        assert reused is not None and reused.probe.ok
        assert reused.probe.method.startswith("POST /slots/ID?action=erase")
    else:  # a slot erase leaves the RAM cache: never kept, a fresh start
        assert reused is None and first.returncode is not None
