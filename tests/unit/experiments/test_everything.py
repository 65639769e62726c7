"""`kvlab run all --quick` on a GPU: vLLM eager unless the user chose, and a pressure run paced
for the GPU's speed. Both from the H200 pass of 2026-12-02 (docs/validation/h200-run-all.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.core.settings import LoadedSettings, Settings
from kvlab.experiments.everything import QUICK_EAGER, AllSpec, quick_settings


def _loaded(tmp_path: Path, profile: str, sources: dict[str, str] | None = None,
            **values: object) -> LoadedSettings:
    settings = Settings(kvlab_home=str(tmp_path), **values)  # type: ignore[arg-type]
    return LoadedSettings(settings, sources or {}, None, profile=profile)


def test_quick_on_a_gpu_starts_vllm_eager_and_says_so(tmp_path: Path) -> None:
    values, note = quick_settings(_loaded(tmp_path, "gpu"), quick=True)
    assert values.enforce_eager and note == QUICK_EAGER


def test_the_users_choice_and_the_full_run_are_left_alone(tmp_path: Path) -> None:
    chosen = _loaded(tmp_path, "gpu", {"enforce_eager": "environment"}, enforce_eager=False)
    assert quick_settings(chosen, quick=True) == (chosen.values, "")
    full = _loaded(tmp_path, "gpu")
    assert quick_settings(full, quick=False) == (full.values, "")
    cpu = _loaded(tmp_path, "cpu-tiny")
    assert quick_settings(cpu, quick=True) == (cpu.values, "")


def test_quick_paces_the_pressure_runs_for_the_device() -> None:
    assert AllSpec.quick("shared-prefix", gpu=True).offload_concurrency == 8
    assert AllSpec.quick("shared-prefix").offload_concurrency == 2


def test_run_all_says_where_the_pass_is_and_what_is_left_by_the_last_runs(
        tmp_path: Path) -> None:
    """#49: `kvlab run all` shows the whole pass's progress: experiment n of m, the time in,
    and what the experiments still to run took when they last ran here (the H200 eager
    pass's notebook: its offload lab took 445 s)."""
    import shutil

    from kvlab.experiments.everything import progress
    from kvlab.experiments.lab import Lab

    book = tmp_path / "notebook.jsonl"
    shutil.copy(Path(__file__).resolve().parents[3] / "docs" / "validation" / "h200-run-all"
                / "eager" / "notebook.jsonl", book)
    lab = Lab(Settings(kvlab_home=str(tmp_path), labbook=str(book)))
    order = ["offload", "shared", "disagg"]
    assert progress(lab, order, 0, 0.0) == (
        "(1 of 3, 0 min 00 s in; about 7 min 25 s for the 3 still to run, by this notebook's "
        "last runs of 1 of them)")
    assert progress(lab, order, 1, 452.4) == "(2 of 3, 7 min 32 s in)"
    empty = Lab(Settings(kvlab_home=str(tmp_path), labbook=str(tmp_path / "none.jsonl")))
    assert progress(empty, order, 2, 61.0) == "(3 of 3, 1 min 01 s in)"


def test_installs_are_said_and_kept_apart_from_the_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45: a GPU user with MODEL alone gets the llama.cpp rows: before the first llama
    experiment the run makes the GGUF (and builds llama-server, minutes with CUDA), and that
    time is install time, said, and not counted in the pass's time."""
    from kvlab.engines.models import write_shaped_config
    from kvlab.experiments import everything
    from kvlab.experiments.lab import Lab

    monkeypatch.setattr(everything, "INSTALL_SAID_S", 0.0)  # the tiny shape is made at once
    model = write_shaped_config(tmp_path / "shaped", "tiny")
    said: list[str] = []
    lab = Lab(Settings(kvlab_home=str(tmp_path / "home"), model=str(model), llama_model="",
                       llama_bin=str(tmp_path / "bin")), say=said.append)
    assert everything._unwanted(lab, "disk") is None  # MODEL can be made into a GGUF
    assert everything._prepared(lab, "disk") is None
    assert lab.install_s > 0
    assert any("llama.cpp: making a GGUF from MODEL" in s for s in said)
    assert said[-1].startswith("    installs for disk: ")
    assert "(install time, not the pass's:" in said[-1]
