"""When an experiment's engines may start together on one GPU (`experiments/together.py`): the
device's memory from a fake `nvidia-smi` on PATH (never a real GPU), the weights from the model
directory (files, or a dense decoder's config for random weights made at load)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvlab.core.hardware import device_memory_bytes
from kvlab.core.settings import Settings
from kvlab.engines.models import write_shaped_config
from kvlab.experiments import together
from kvlab.measure import kvmath

GIB = 2**30
H200_QUERY = "143771\n"  # nvidia-smi --query-gpu=memory.total, MiB, as an H200 reports it


def fake_smi(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nprintf "{answer}"\n', encoding="utf-8")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def gpu_lab(model: Path, fraction: float = 0.85, remote: bool = False) -> Any:
    return SimpleNamespace(settings=Settings(model=str(model), mem_fraction=fraction),
                           install=lambda engine: SimpleNamespace(platform="cuda"),
                           placement=SimpleNamespace(remote=remote))


def test_the_device_memory_is_nvidia_smis_and_unknown_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path / "bin", monkeypatch, H200_QUERY)
    assert device_memory_bytes() == 143771 * 2**20
    fake_smi(tmp_path / "spark", monkeypatch, "[N/A]\n")
    assert device_memory_bytes() is None


def test_a_shaped_8b_without_weight_files_is_sized_from_its_config(tmp_path: Path) -> None:
    model = write_shaped_config(tmp_path / "8b", "qwen3-8b")
    # 36 layers of (2 x 4096 x 4096 + 2 x 4096 x 1024 + 3 x 4096 x 12288), and the one
    # (tied) embedding matrix of its tokenizer's vocabulary, at bf16
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    assert config["tie_word_embeddings"] is True
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288
    assert kvmath.weight_bytes(model) == 2 * (36 * layer + config["vocab_size"] * 4096)
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    assert kvmath.weight_bytes(model) == 1000  # the files, when there are files
    assert kvmath.weight_bytes(tmp_path / "Qwen" / "Qwen3-8B") is None  # a Hub id


def test_four_8b_engines_share_an_h200_and_six_do_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path / "bin", monkeypatch, H200_QUERY)
    lab = gpu_lab(write_shaped_config(tmp_path / "8b", "qwen3-8b"))
    assert together.apart(lab, [9 * GIB, 2 * GIB, 9 * GIB, 2 * GIB]) is None
    why = together.apart(lab, [9 * GIB] * 6)
    assert why is not None and "of a 19.9 GiB share of MEM_FRACTION 0.85 of the device" in why


def test_they_start_apart_where_nothing_says_they_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_shaped_config(tmp_path / "8b", "qwen3-8b")
    assert together.apart(gpu_lab(model, remote=True), [GIB]) == "they are placed on Ray nodes"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert together.apart(gpu_lab(model), [GIB]) == \
        "nvidia-smi did not say the device's memory"
    fake_smi(tmp_path / "bin", monkeypatch, H200_QUERY)
    why = together.apart(gpu_lab(Path("Qwen/Qwen3-8B")), [GIB])
    assert why is not None and "Qwen/Qwen3-8B's weights is not known here" in why
