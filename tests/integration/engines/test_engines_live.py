"""The engines for real: start from a plan, parse the startup log, answer, stop cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from children import running
from integration.conftest import cpu_settings
from kvlab.core.errors import EngineError
from kvlab.engines import PlanRequest, llamacpp, startup, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.engines.process_groups import group_alive
from kvlab.records import notebook
from kvlab.records.models import StartupRecord
from kvlab.records.rows import serve_label


def processes_mentioning(text: str) -> list[int]:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(text in part for part in (p.info["cmdline"] or [])):
            found.append(p.info["pid"])
    return found


async def test_vllm_cpu_lifecycle(tmp_path: Path, tiny_models: TinyModels,
                                  vllm_install: vllm.VllmInstall) -> None:
    settings = cpu_settings(model=tiny_models.hf)
    plan = vllm.plan(settings, "baseline", vllm_install, PlanRequest(port=free_port()))
    proc = EngineProcess(plan, tmp_path / "vllm.log", run_dir=tmp_path / "run")
    async with proc:
        version = await startup.server_version(plan)
        record = startup.record(plan, proc.log_text(), ready_s=proc.ready_s,
                                engine_version=version,
                                label=serve_label(plan.role, plan.host_tier))
        async with httpx.AsyncClient(base_url=plan.base_url, timeout=60) as client:
            metrics = (await client.get("/metrics")).text
            reply = await client.post("/v1/completions", json={
                "model": settings.served_name, "prompt": "Hello there", "max_tokens": 4,
                "ignore_eos": True})
        pgid = proc.pid
    assert version.startswith("0.32.0")
    cap = record.capacity
    assert cap.kv_cache_tokens == 524_288  # 1 GiB / 2,048 bytes per token
    assert cap.max_concurrency == 128.0 and cap.device == "CPU"
    assert "vllm:prefix_cache_queries_total" in metrics
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    notebook.append(tmp_path / "book.md", record)
    line = notebook.read(tmp_path / "book.md").records[0]
    assert isinstance(line, StartupRecord)
    assert line.record == "startup" and line.context_tokens == settings.ctx
    assert pgid is not None and not group_alive(pgid)
    assert processes_mentioning(tiny_models.hf) == []


async def test_llama_server_lifecycle(tmp_path: Path, tiny_models: TinyModels,
                                      llama_binary: Path) -> None:
    settings = cpu_settings(llama_slot_save_path=str(tmp_path / "slots"))
    plan = llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(port=free_port()))
    proc = EngineProcess(plan, tmp_path / "llama.log")
    async with proc:
        version = await startup.server_version(plan)
        async with httpx.AsyncClient(base_url=plan.base_url, timeout=60) as client:
            metrics = (await client.get("/metrics")).text
            reply = await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        record = startup.record(plan, proc.log_text(), ready_s=proc.ready_s,
                                engine_version=version,
                                label=serve_label(plan.role, plan.host_tier))
        pgid = proc.pid
    assert "0c1e570" in version
    assert record.capacity.slots == 2 and record.capacity.tokens_per_slot == 2048
    assert llamacpp.PROMPT_TOKENS in metrics
    assert reply.json()["timings"]["prompt_n"] > 0
    assert (tmp_path / "slots").stat().st_mode & 0o777 == 0o700
    assert pgid is not None and not group_alive(pgid)


async def test_engine_that_dies_during_start_is_reported(tmp_path: Path,
                                                         llama_binary: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not a gguf file")
    settings = cpu_settings(llama_model=str(bad), llama_slot_save_path=str(tmp_path / "s"))
    plan = llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(port=free_port()))
    with pytest.raises(EngineError) as err:
        async with EngineProcess(plan, tmp_path / "bad.log"):
            pass
    message = str(err.value)
    assert "during start" in message and "bad.log" in message and "\n" not in message


def test_kvlab_serve_llama_foreground_ctrl_c(tmp_path: Path, tiny_models: TinyModels,
                                             llama_binary: Path) -> None:
    port = free_port()
    env = {**os.environ, "LLAMA_MODEL": tiny_models.gguf, "LLAMA_PORT": str(port),
           "LLAMA_SLOT_SAVE_PATH": str(tmp_path / "slots"), "LABBOOK": str(tmp_path / "b.md")}
    with running([sys.executable, "-m", "kvlab", "serve", "llama"], env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        deadline = time.monotonic() + 60
        while not (tmp_path / "b.md").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
        with pytest.raises(httpx.ConnectError):  # kvlab stopped it, not `running`'s cleanup
            httpx.get(f"http://127.0.0.1:{port}/health")
    assert child.returncode == 130, err
    assert "==> llama.cpp llama-server with its cache tiers" in out
    record = json.loads((tmp_path / "b.md").read_text().splitlines()[0])
    assert record["record"] == "startup" and record["capacity"]["slots"] == 2
