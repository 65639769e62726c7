"""What kvlab says is what happened, on real llama-servers: the serve summary states what the
engine arguments set, `kvlab llama slots` does not call a restored slot empty, one engine on
both proxy legs is refused, `proxy --check --url` asks the running proxy for its legs, and
`run offload --dry-run --part pressure` lists the pressure plans only."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from children import running
from integration.conftest import cpu_settings
from kvlab.engines import llamacpp
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess


def kvlab(*args: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, env=env)


def _wait_for(path: Path, within_s: float = 90) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert path.exists(), f"{path} did not appear"


def test_serve_summary_and_slots_say_what_the_engine_holds(tmp_path: Path,
                                                           tiny_models: TinyModels,
                                                           llama_binary: Path) -> None:
    port = free_port()
    env = {**os.environ, "LLAMA_MODEL": tiny_models.gguf, "LLAMA_PORT": str(port),
           "LLAMA_SLOT_SAVE_PATH": str(tmp_path / "slots"), "LABBOOK": str(tmp_path / "b.md"),
           "KVLAB_HOME": os.environ.get("KVLAB_HOME", str(Path.home() / ".cache" / "kvlab"))}
    with running([sys.executable, "-m", "kvlab", "llama", "serve", "--", "-c", "2048"],
                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        out, err, slots = _fill_save_restore(child, tmp_path, env, port)
    assert "context          2048 (set by the engine arguments after --; the settings say " \
           "4096)" in out
    assert "tokens per slot  1024 (set by the engine arguments" in out
    assert "the engine reports: context 1024, block size 1" in err  # per slot, from /props
    assert slots.returncode == 0, slots.stderr
    slot_lines = [ln for ln in slots.stdout.splitlines() if ln.strip().startswith("slot ")]
    assert "holds" in slot_lines[0] and "holds 0 " not in slot_lines[0]
    assert "holds 0 prompt tokens" not in slot_lines[1]
    assert "prompt tokens not reported" in slot_lines[1]


def _fill_save_restore(child: subprocess.Popen[str], tmp_path: Path, env: dict[str, str],
                       port: int) -> tuple[str, str, subprocess.CompletedProcess[str]]:
    """Fill slot 0 of the running `kvlab llama serve`, save it, restore it into slot 1,
    list the slots; then Ctrl-C it. Its output, and what `kvlab llama slots` said."""
    try:
        _wait_for(tmp_path / "b.md")
        base = f"http://127.0.0.1:{port}"
        filled = httpx.post(f"{base}/completion", json={
            "prompt": "the cache keeps what the engine read " * 20, "n_predict": 2,
            "id_slot": 0, "cache_prompt": True}, timeout=60)
        assert filled.status_code == 200
        saved = kvlab("llama", "save", "0", "kept.bin", env=env)
        assert saved.returncode == 0, saved.stderr
        restored = kvlab("llama", "restore", "1", "kept.bin", env=env)  # an unused slot
        assert restored.returncode == 0, restored.stderr
        slots = kvlab("llama", "slots", env=env)
    finally:
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    return out, err, slots


@pytest.fixture
async def two_llamas(tmp_path: Path, tiny_models: TinyModels,
                     llama_binary: Path) -> AsyncIterator[list[str]]:
    settings = cpu_settings(llama_slot_save_path=str(tmp_path / "slots"))
    plans = [llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(
        port=free_port(), role=f"llama-{n}")) for n in "ab"]
    async with EngineProcess(plans[0], tmp_path / "a.log"), \
            EngineProcess(plans[1], tmp_path / "b.log"):
        yield [p.base_url for p in plans]


async def test_one_engine_on_both_legs_is_refused_at_start(two_llamas: list[str]) -> None:
    a = two_llamas[0]
    run = await asyncio.to_thread(kvlab, "proxy", "--prefill", a, "--decode",
                                  a.replace("127.0.0.1", "localhost"))
    assert run.returncode == 2
    assert run.stderr.startswith(f"kvlab: {a} is both a prefill and a decode leg")


def _check_through_a_running_proxy(prefill: str, decode: str) -> dict[str, object]:
    """`kvlab proxy --check --url` against a kvlab proxy started on a port of its own."""
    port = free_port()
    with running([sys.executable, "-m", "kvlab", "proxy", "--prefill", prefill, "--decode",
                  decode, "--port", str(port), "--workers", "1"], stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True) as proxy:
        try:
            assert proxy.stdout is not None
            for line in proxy.stdout:
                if line.startswith("==> ready"):
                    break
            run = kvlab("proxy", "--check", "--url", f"http://127.0.0.1:{port}", "--json")
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.communicate(timeout=30)
    result: dict[str, object] = json.loads(run.stdout)
    result["port"] = port
    return result


async def test_proxy_check_url_asks_the_running_proxy_for_its_legs(two_llamas: list[str]
                                                                   ) -> None:
    a, b = two_llamas
    result = await asyncio.to_thread(_check_through_a_running_proxy, a, b)
    assert result["legs_from"] == f"http://127.0.0.1:{result['port']}/health"
    assert isinstance(result["prefill"], dict) and isinstance(result["decode"], dict)
    assert list(result["prefill"]) == [a] and list(result["decode"]) == [b]


def test_offload_dry_run_lists_the_part_asked_for() -> None:
    run = kvlab("run", "offload", "--dry-run", "--part", "pressure", "--json")
    assert run.returncode == 0, run.stderr
    labels = [p["label"] for p in json.loads(run.stdout)["plans"]]
    assert labels == ["offload-off-load", "offload-on-load"]
    quiet = kvlab("run", "offload", "--dry-run", "--part", "quiet", "--json")
    assert [p["label"] for p in json.loads(quiet.stdout)["plans"]] == ["offload-off",
                                                                       "offload-on"]
