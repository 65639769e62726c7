"""`kvlab run all --quick` on a GPU: vLLM eager unless the user chose, and a pressure run paced
for the GPU's speed. Both from the H200 pass of 2026-12-02 (docs/validation/h200-run-all.md)."""

from __future__ import annotations

from pathlib import Path

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
