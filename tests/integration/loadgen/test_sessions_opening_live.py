"""The shared-first-block control on a real engine (#46): user sessions whose system line
opens with a tag of each conversation's own share no prefix across conversations.

llama-server reuses any common prefix of a slot's last prompt (no blocks), so a first turn of
a new conversation on a slot another conversation used finds the shared system line cached;
with distinct openings it finds at most the chat template's role marker before the tag."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines import LLAMA_CPP, llamacpp
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.loadgen.sessions import SessionSpec, ThinkTime
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import run_sweep
from kvlab.records.models import LoadRecord


def users(url: str, distinct: bool) -> LoadSpec:
    return LoadSpec(base_url=url, model="local-chat", levels=(2,), requests=None,
                    max_tokens=4, prompt_set="sessions", label="opening", preamble_tokens=120,
                    seed=5, ignore_eos=True, timeout_s=120, warmup=0, engine=LLAMA_CPP,
                    sessions=SessionSpec(turns=2, think=ThinkTime("fixed", 0.0),
                                         conversations=6, distinct_opening=distinct))


@pytest.mark.llama
async def test_distinct_openings_share_no_prefix_across_conversations(
        llama_binary: Path, tmp_path: Path) -> None:
    settings = cpu_settings(llama_slot_save_path=str(tmp_path / "slots"))
    plan = llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(
        port=free_port(), parallel=2, cache_ram_mib=0))
    async with EngineProcess(plan, tmp_path / "llama.log"):
        url = plan.base_url + "/v1"
        shared = (await run_sweep(users(url, False))).rows[0]
        distinct = (await run_sweep(users(url, True))).rows[0]
    assert isinstance(shared, LoadRecord) and isinstance(distinct, LoadRecord)
    a, b = shared.sessions, distinct.sessions
    assert a is not None and b is not None, (shared.failures, distinct.failures)
    assert shared.ok == distinct.ok == 12
    assert distinct.workload is not None and distinct.workload.distinct_opening is True
    assert shared.workload is not None and shared.workload.distinct_opening is None
    # first turns after the first two found the system line another conversation left
    assert a.first_turn_cached_tokens_mean is not None and b.first_turn_cached_tokens_mean \
        is not None
    assert a.first_turn_cached_tokens_mean >= 8, a
    assert b.first_turn_cached_tokens_mean <= 4, b
    # returning turns still find their own conversation: the control changes only the opening
    assert (b.returning_hit_rate or 0) > 0.5 and (a.returning_hit_rate or 0) > 0.5, (a, b)
