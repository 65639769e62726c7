"""llama-server facts the slot store and experiments rely on, and the experiments' pure parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.core.errors import EngineError, SettingError
from kvlab.core.settings import Settings
from kvlab.engines import llamacpp
from kvlab.engines.llamacpp.client import (
    LlamaTarget,
    target_from_settings,
    write_serve_record,
)
from kvlab.engines.llamacpp.server import check_fits
from kvlab.engines.plan import EnginePlan
from kvlab.experiments import llama_disk as disk
from kvlab.experiments import llama_interference as interference
from kvlab.observe.chat import logprob_gap
from kvlab.records import notebook
from kvlab.records.evidence import CachedTokens, Percentiles
from kvlab.records.models import LoadRecord

# lines as llama-server 0c1e570 logs them around a failed restore
RESTORE_LOG = """\
0.14.095.469 I slot      release: id  0 | task 1 | stop processing: n_tokens = 39, truncated = 0
0.14.119.644 E llama_state_seq_load_file: error loading sequence state file: n_stream mismatch
0.14.119.760 E srv    send_error: task id = 7, error: Unable to restore slot: No available \
space in KV cache or invalid slot save file
0.14.119.800 W srv          stop: cancel task, id_task = 7
"""


def test_the_logs_reason_beats_the_generic_400() -> None:
    reason = llamacpp.slot_failure_reason(RESTORE_LOG)
    assert reason == ("llama_state_seq_load_file: error loading sequence state file: "
                      "n_stream mismatch")
    only_generic = "\n".join(ln for ln in RESTORE_LOG.splitlines() if "n_stream" not in ln)
    assert "Unable to restore slot" in str(llamacpp.slot_failure_reason(only_generic))
    assert llamacpp.slot_failure_reason("0.1 I all fine\n") is None


def plan_with(tmp_path: Path, *extra: str, cache_type: str = "q8_0") -> EnginePlan:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    settings = Settings(llama_model=str(model), llama_cache_type=cache_type,  # type: ignore[arg-type]
                        llama_slot_save_path=str(tmp_path / "slots"))
    return llamacpp.plan(settings, "llama-server", llamacpp.LlamaOptions(extra_args=extra))


def test_flash_attention_and_kv_types_follow_the_command_line(tmp_path: Path) -> None:
    plan = plan_with(tmp_path)
    assert llamacpp.flash_attn_mode(plan) == "auto"
    assert llamacpp.kv_types(plan) == ("q8_0", "q8_0")
    plan = plan_with(tmp_path, "-fa", "off", "-ctv", "f16")
    assert llamacpp.flash_attn_mode(plan) == "off"
    assert llamacpp.kv_types(plan) == ("q8_0", "f16")
    assert llamacpp.flash_attn_mode(plan_with(tmp_path, "--flash-attn=on")) == "on"


def test_quantised_kv_is_labelled() -> None:
    q8 = llamacpp.kv_label("q8_0")
    assert q8.kv_cache_type == "q8_0" and q8.kv_quantised is True
    assert "outputs change" in str(q8.kv_note)
    assert llamacpp.kv_label("q4_0", "q4_0").kv_quantised is True
    f16 = llamacpp.kv_label("f16", "f16")
    assert f16.model_dump(exclude_none=True) == {"kv_cache_type": "f16", "kv_quantised": False}
    assert llamacpp.kv_label("q8_0", "f16").kv_cache_type == "K q8_0 / V f16"


def test_every_flag_of_the_plan_is_checked_against_help(tmp_path: Path) -> None:
    plan = plan_with(tmp_path)
    accepted = frozenset(f.name for f in plan.flags)
    llamacpp.check_plan_flags(plan, accepted)
    with pytest.raises(EngineError, match="does not accept --slot-save-path"):
        llamacpp.check_plan_flags(plan, accepted - {"--slot-save-path"})


def test_serve_record_tells_save_and_restore_how_the_server_runs(tmp_path: Path) -> None:
    settings = Settings(kvlab_home=str(tmp_path / "home"), llama_cache_type="f16",
                        llama_slot_save_path=str(tmp_path / "fallback"))
    fallback = target_from_settings(settings, 18123)
    assert fallback.source == "settings" and fallback.kv_type_k == "f16"
    assert fallback.base_url == "http://127.0.0.1:18123"
    plan = plan_with(tmp_path, "-fa", "off")
    plan = type(plan)(**{**plan.__dict__, "port": 18123})
    record = write_serve_record(settings, plan, tmp_path / "serve.log")
    target = target_from_settings(settings, 18123)
    assert target.source.startswith("kvlab llama serve") and target.flash_attn == "off"
    assert (target.kv_type_k, target.log_path) == ("q8_0", tmp_path / "serve.log")
    assert target.slot_dir == tmp_path / "slots"
    assert json.loads(record.read_text())["model"] == plan.model


TOP = [(" a", -7.1), (" b", -7.3)]


def test_logprob_gap_compares_shared_tokens_only() -> None:
    assert logprob_gap(TOP, [(" b", -7.2), (" c", -1.0)]) == pytest.approx(0.1)
    assert logprob_gap(TOP, [(" z", -1.0)]) is None and logprob_gap([], TOP) is None


def test_a_slot_must_hold_the_prompt() -> None:
    check_fits(3500, 8, 8192, 2)
    with pytest.raises(SettingError, match="4096/2 = 2048 tokens"):
        check_fits(3500, 8, 4096, 2)
    with pytest.raises(SettingError, match="CTX/parallel"):
        disk.DiskSpec(ctx=4096).check()


def row(label: str, parallel: int, ttft: float, tpot: float, out: float,
        prompt_set: str = "mixed") -> LoadRecord:
    return LoadRecord(
        label=label, lab=notebook.LAB_PD, concurrency=4, requests=8, model="m",
        prompt_set=prompt_set, preamble_tokens=300, max_tokens=16, kv_cache_type="q8_0",
        llama_parallel=parallel, ttft_s=Percentiles(p50=ttft), tpot_s=Percentiles(p50=tpot),
        output_tokens_per_s=out, failed=0,
        cached_tokens_per_response=CachedTokens(responses=8, total=16, mean=2.0))


def test_interference_comparison_pairs_against_the_most_slots() -> None:
    spec = interference.InterferenceSpec(label="i")
    rows = [row("i-parallel-4", 4, 2.0, 0.5, 10.0), row("i-parallel-1", 1, 3.0, 0.01, 20.0)]
    comp = interference.comparison(spec, rows)
    assert comp.record == "comparison" and comp.same_experiment is True
    level = comp.levels[0]
    assert (level.ttft_p50_ratio, level.tpot_p50_ratio) == (1.5, 0.02)
    assert level.output_tokens_per_s_ratio == 2.0
    notebook.encode(comp)  # writable as a notebook line
    rows[1] = row("i-parallel-1", 1, 3.0, 0.01, 20.0, prompt_set="shared-prefix")
    assert interference.comparison(spec, rows).differs == ["prompt_set"]


def test_interference_prompt_budget_is_a_slot_at_the_most_slots() -> None:
    assert interference.InterferenceSpec(ctx=4096, max_tokens=16).budget() == 1024 - 16 - 32
    with pytest.raises(SettingError):
        interference.InterferenceSpec(ctx=256, parallels=(4, 1)).budget()


def test_target_from_plan_reads_the_plan(tmp_path: Path) -> None:
    target = LlamaTarget.from_plan(plan_with(tmp_path, "-fa", "on"), tmp_path / "x.log")
    assert (target.kv_type_k, target.flash_attn, target.source) == ("q8_0", "on", "plan")
