"""`kvlab run all` end to end on the CPU engines (quick sizes), and an engine that dies in
the middle of an experiment: a clear error, and everything torn down."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from integration.conftest import cpu_settings
from kvlab.core.errors import KvlabError
from kvlab.core.settings import Settings
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import port_in_use
from kvlab.engines.strays import stray_records
from kvlab.experiments import shared
from kvlab.experiments.lab import Lab
from kvlab.records import notebook
from kvlab.records.models import (
    CrossingRecord,
    DiskRecord,
    NotRunRecord,
    ProofRecord,
    ReuseRecord,
    StartupRecord,
)

pytestmark = pytest.mark.vllm


def test_run_all_quick_fills_every_cell_and_leaves_nothing(
        tmp_path: Path, tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
        llama_binary: Path) -> None:
    book = tmp_path / "labbook.md"
    env = {**os.environ, "LABBOOK": str(book)}
    result = subprocess.run([sys.executable, "-m", "kvlab", "run", "all", "--quick", "--json",
                             "--report-dir", str(tmp_path / "report")], env=env,
                            capture_output=True, text=True, timeout=1500, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert all(r["ok"] for r in data["experiments"].values()), data["experiments"]
    for table in data["report"]["tables"]:
        for row in table["rows"]:
            assert all(c.strip() and not c.startswith("not measured yet") for c in row), row
    read = notebook.read(book)
    run = [r for r in read.records if r.run_id == data["run_id"]]
    verdicts = {r.label: r for r in run if r.record in ("reuse", "proof", "disk", "crossing")}
    quiet, proof = verdicts["offload-off"], verdicts["shared-store-proof"]
    disk, crossing = verdicts["disk"], verdicts["disagg"]
    assert isinstance(quiet, ReuseRecord) and quiet.summary is not None
    assert quiet.summary.reused_turns >= 1
    assert isinstance(proof, ProofRecord)
    assert proof.verdicts["identical-on-b"] == "reused"
    assert proof.verdicts["changed-prefix-on-b"] == "no-reuse-expected"
    assert isinstance(disk, DiskRecord) and disk.verdict == "reuse proven"
    assert isinstance(crossing, CrossingRecord) and crossing.crossed is True
    skipped = {r.label: r.reason for r in read.of(NotRunRecord)}
    assert "cannot offload" in skipped["offload-on"]
    assert "two machines" in skipped["disagg-two-machines"]
    ports = [int(r.argv[r.argv.index("--port") + 1]) for r in run
             if isinstance(r, StartupRecord) and "--port" in r.argv]
    assert ports and not any(port_in_use("127.0.0.1", p) for p in ports)
    assert not (Settings().home() / "stores" / data["run_id"]).exists()
    assert (tmp_path / "report" / "report.md").is_file()


# SIGKILLing an engine while a request to it is in flight sometimes leaves httpcore's pooled
# socket to the dead peer to the garbage collector (seen 1 run in 3); that is the injected
# fault's debris, not a path kvlab takes in normal operation
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_engine_death_mid_experiment_is_a_clear_error_and_tears_down(
        tmp_path: Path, tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
        monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[object] = []
    original = shared.pair_plans

    def capture(lab: Lab, store: str, memory: object = None,
                kind: str = "shared") -> list[object]:
        plans = original(lab, store, memory, kind)  # type: ignore[arg-type]
        captured.extend(plans)
        return plans  # type: ignore[return-value]

    monkeypatch.setattr(shared, "pair_plans", capture)
    settings = cpu_settings(model=tiny_models.hf, small_model=tiny_models.hf,
                            labbook=str(tmp_path / "book.md"))
    lab = Lab(settings)
    task = asyncio.create_task(shared.run(lab, shared.SharedSpec(turns=6,
                                                                 preamble_words=300)))
    victim = await _wait_healthy_b(captured, task)
    for record in stray_records(settings.home() / "run"):
        if record.port == victim.port:  # type: ignore[attr-defined]
            os.killpg(record.pid, signal.SIGKILL)
    with pytest.raises(KvlabError) as err:
        await task
    assert "\n" not in str(err.value)
    for plan in captured:
        assert not port_in_use("127.0.0.1", plan.port)  # type: ignore[attr-defined]
    assert not (settings.home() / "stores" / lab.run_id).exists()


async def _wait_healthy_b(captured: list[object], task: asyncio.Task[object]) -> object:
    async with httpx.AsyncClient(timeout=2.0) as client:
        for _ in range(1200):
            if task.done():
                task.result()
                raise AssertionError("the experiment ended before instance b was up")
            if len(captured) == 2:
                try:
                    url = captured[1].health_url  # type: ignore[attr-defined]
                    if (await client.get(url)).status_code == 200:
                        return captured[1]
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(0.25)
    raise AssertionError("instance b never became healthy")
