"""The slot oracle beside real llama-server levels: two slots, prompts that share a preamble
and prompts that share nothing, one and two at a time. The oracle's hit share (from the
server's own /apply-template, /tokenize and /props) is within 5 points of the `cache_n` each
response reported, per level; where a request differs, the assertion lists it. The in-RAM
prompt cache is off (`--cache-ram 0`): the oracle does not model it."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.conftest import cpu_settings, oracle_misses
from kvlab.engines import LLAMA_CPP, llamacpp
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.loadgen.sweep import LoadSpec, run_sweep
from kvlab.records import notebook
from kvlab.records.models import LoadRecord

pytestmark = pytest.mark.llama
TOLERANCE = 0.05  # the bound on the oracle's error per level


def differing(book: Path, row: LoadRecord) -> list[str]:
    return oracle_misses(book, row, lambda x: f"prompt {x.prompt_index}")


@pytest.mark.parametrize("prompt_set", ["shared-prefix", "mixed"])
async def test_the_slot_oracle_predicts_llama_servers_cache_n(
        prompt_set: str, tiny_models: TinyModels, llama_binary: Path, tmp_path: Path) -> None:
    settings = cpu_settings(llama_slot_save_path=str(tmp_path / "slots"))
    plan = llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(
        port=free_port(), parallel=2, cache_ram_mib=0))
    book = tmp_path / "labbook.md"
    async with EngineProcess(plan, tmp_path / "llama.log"):
        spec = LoadSpec(base_url=plan.base_url + "/v1", model="local-chat", levels=(1, 2),
                        requests=16, max_tokens=4, prompt_set=prompt_set, label=prompt_set,
                        engine=LLAMA_CPP, preamble_tokens=300, seed=3, ignore_eos=True,
                        labbook=str(book), timeout_s=120)
        await run_sweep(spec, on_row=lambda r: notebook.append(book, r))
    rows = notebook.read(book).of(LoadRecord)
    assert [r.concurrency for r in rows] == [1, 2]
    for row in rows:
        o = row.oracle
        assert o is not None and o.slots == 2 and o.requests == row.ok == 16, row
        predicted, measured = o.predicted_share, o.measured_share
        assert predicted is not None and measured is not None
        assert abs(predicted - measured) <= TOLERANCE, (predicted, measured,
                                                        differing(book, row))
        assert o.predicted_cached_tokens <= o.infinite_cache_tokens
    if prompt_set == "shared-prefix":  # the preamble is what the slots reuse
        assert all((r.oracle.predicted_share or 0) > 0.5 for r in rows if r.oracle)
