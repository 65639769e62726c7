"""mlx-lm's prompt-cache file on the real engine (mlx[cpu] in kvlab's venv for it) and the
tiny model: timed against a cold prefill, loaded by a second process, and refused by kvlab's
manifest when it was computed for another model of the same shapes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.core.errors import RefusedError
from kvlab.engines import mlx
from kvlab.engines.models import TinyModels
from kvlab.experiments import mlx_cache
from kvlab.experiments.lab import Lab
from kvlab.records import notebook
from kvlab.records.models import DiskRecord
from kvlab.report import build

pytestmark = pytest.mark.mlx


def _lab(tmp_path: Path, models: TinyModels) -> Lab:
    return Lab(cpu_settings(model=models.hf, labbook=str(tmp_path / "book.md")))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_cache_file_skips_the_prefill_and_gives_the_cold_logprobs(
        tmp_path: Path, tiny_models: TinyModels, mlx_python: Path) -> None:
    lab = _lab(tmp_path, tiny_models)
    written = await mlx_cache.run(lab, mlx_cache.MlxCacheSpec(prompt_tokens=600,
                                                                    parts=("file",)))
    assert [r.record for r in written] == ["disk"]
    r = notebook.read(tmp_path / "book.md").of(DiskRecord, "mlx-cache")[0]
    assert r.engine == "mlx-lm" and r.verdict == "reuse proven", r.reasons
    assert r.prompt_tokens == 600 and r.post_restore_cached_tokens == 599
    assert r.cold_ttft_s and r.post_restore_ttft_s is not None
    assert r.post_restore_ttft_s < r.cold_ttft_s / 5
    assert r.file_bytes and r.file_bytes > 599 * 2048  # 2,048 bytes a token on the tiny model
    assert r.evidence and r.evidence.logprob_max_abs_diff is not None
    assert r.evidence.logprob_max_abs_diff <= 1e-3
    assert not Path(str(r.evidence.slot_file)).exists()  # noqa: ASYNC240 (not kept unless asked)
    line = next(x for x in build(tmp_path / "book.md").tables[0].lines
                if x.name == "Disk, mlx-lm prompt-cache file")
    assert line.verdict == "reuse proven" and "(after restore)" in line.cells[1]


async def test_a_file_from_another_model_is_refused_before_it_loads(
        tmp_path: Path, tiny_models: TinyModels, other_tiny_models: TinyModels,
        mlx_python: Path) -> None:
    lab = _lab(tmp_path, tiny_models)
    [r] = await mlx_cache.run(lab, mlx_cache.MlxCacheSpec(prompt_tokens=64, keep_file=True,
                                                                  parts=("file",)))
    assert isinstance(r, DiskRecord) and r.evidence and r.evidence.slot_file
    kept = Path(r.evidence.slot_file)
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700  # it holds the user's prompt
    assert _mode(kept) == 0o600  # #48 finding 13: it was 0644
    mlx.check_file(kept, tiny_models.hf)  # its own model: accepted
    with pytest.raises(RefusedError, match="computed for another model: kvlab_model_digest") \
            as err:
        mlx.check_file(kept, other_tiny_models.hf)
    # each model by its path: both were "(hf)"
    for model in (tiny_models.hf, other_tiny_models.hf):
        assert f"({mlx.manifest(model)['kvlab_model']})" in str(err.value)
        assert mlx.manifest(model)["kvlab_model"].endswith(model.split("/")[-2] + "/hf")
    # a file mlx-lm wrote without kvlab's manifest says nothing of its model: refused too
    job = tmp_path / "job.json"
    bare = tmp_path / "bare.safetensors"
    job.write_text(json.dumps({"model": tiny_models.hf, "text": "a few words " * 40,
                               "prompt_tokens": 32, "file": str(bare), "top": 3,
                               "metadata": {}}), encoding="utf-8")
    mlx.run_step(mlx_python, "save", job)
    with pytest.raises(RefusedError, match="carries no kvlab manifest"):
        mlx.check_file(bare, tiny_models.hf)


async def test_the_server_reuses_the_conversation_across_turns(
        tmp_path: Path, tiny_models: TinyModels, mlx_python: Path) -> None:
    from kvlab.records.models import ReuseRecord

    lab = _lab(tmp_path, tiny_models)
    spec = mlx_cache.MlxCacheSpec(parts=("turns",), turns=3)  # a preamble of 400 words
    [written] = await mlx_cache.run(lab, spec)
    r = notebook.read(tmp_path / "book.md").of(ReuseRecord, "mlx-turns")[0]
    assert written.record == "reuse" and len(r.rows) == 3
    later = r.rows[1:]
    assert [t.verdict for t in later] == ["reused", "reused"], [t.verdict for t in r.rows]
    assert all((t.cached_tokens or 0) >= 0.9 * (t.prompt_tokens or 1) for t in later)
    line = next(x for x in build(tmp_path / "book.md").tables[0].lines
                if x.name == "mlx-lm, prompt cache across turns")
    assert line.verdict == "reused 2/2"


async def test_two_mlx_servers_are_compared_by_their_numbers(
        tmp_path: Path, tiny_models: TinyModels, other_tiny_models: TinyModels,
        mlx_python: Path) -> None:
    """mlx_lm.server names no engine kvlab knows, so `kvlab check` compares what its
    /v1/models and the behavioural fingerprint say: the same model agrees, another model of
    the same shapes is refused by the numbers."""
    from kvlab.engines.ports import free_port
    from kvlab.engines.process import EngineProcess
    from kvlab.measure import compat

    plans = [mlx.server_plan(mlx_python, m.hf, free_port(), tmp_path / "hub", role=f"mlx-{i}")
             for i, m in enumerate((tiny_models, tiny_models, other_tiny_models))]
    async with EngineProcess(plans[0], tmp_path / "a.log"), \
            EngineProcess(plans[1], tmp_path / "b.log"), \
            EngineProcess(plans[2], tmp_path / "c.log"):
        same = await compat.compare([plans[0].base_url + "/v1", plans[1].base_url + "/v1"])
        other = await compat.compare([plans[0].base_url + "/v1", plans[2].base_url + "/v1"],
                                     ignore=("model_id",))
    assert same.compatible, same.refusal()
    assert all(f.fingerprint is not None for f in same.instances)
    assert [m.field for m in other.mismatches] == ["fingerprint"]


async def test_a_file_cut_after_the_save_is_refused_in_one_line(
        tmp_path: Path, tiny_models: TinyModels, mlx_python: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # #48 finding 13: a file cut to half after the save ended in a 63-line traceback
    real = mlx.run_step

    def save_then_cut(python: Path, step: str, job: Path) -> mlx.ShimAnswer:
        answer = real(python, step, job)
        if step == "save":
            written = Path(json.loads(job.read_text(encoding="utf-8"))["file"])
            written.write_bytes(written.read_bytes()[: written.stat().st_size // 2])
        return answer

    monkeypatch.setattr(mlx, "run_step", save_then_cut)
    lab = _lab(tmp_path, tiny_models)
    with pytest.raises(RefusedError, match=r"is not a readable prompt-cache file .*: it was cut "
                                           r"or changed after mlx-lm wrote it") as err:
        await mlx_cache.run(lab, mlx_cache.MlxCacheSpec(prompt_tokens=64, parts=("file",)))
    assert "\n" not in str(err.value)
    store = lab.settings.paths().store(lab.run_id, mlx_cache.MLX_CACHE.label)
    assert not store.exists()
    assert not (tmp_path / "book.md").exists()
