"""llama.cpp's tiers on real llama-servers with the tiny GGUFs.

One module of servers sharing one slot store: A and B (same model and flags), C (another tiny
model, same shapes), D (`--parallel 4`), E (f16 KV instead of q8_0); all with `--cache-ram 0`
so the RAM prompt cache cannot stand in for a restore. Then the CLI, and the experiments run
as `kvlab run` runs them: `run(Lab(settings), spec)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import seeds
from children import running
from integration.conftest import cpu_settings
from kvlab.core.errors import EngineError, InputError, RefusedError
from kvlab.engines import llamacpp
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget
from kvlab.engines.llamacpp.server import READY_S, prompt_of, server_plan
from kvlab.engines.models import TinyModels
from kvlab.engines.plan import EnginePlan
from kvlab.engines.process import EngineProcess
from kvlab.experiments import llama_disk as disk
from kvlab.experiments import llama_interference as interference
from kvlab.experiments import llama_slot_share as slot_share
from kvlab.experiments.lab import Lab as RunLab
from kvlab.observe.chat import logprob_gap
from kvlab.records import notebook
from kvlab.records.models import ComparisonRecord, DiskRecord, LoadRecord, ReuseRecord

pytestmark = pytest.mark.llama

PROMPT_TOKENS = 800
TOLERANCE = 1e-3


@dataclass
class Lab:
    store: slotstore.SlotStore
    hashes: Path
    a: LlamaClient
    b: LlamaClient
    c: LlamaClient
    d: LlamaClient
    e: LlamaClient
    prompt: str


@pytest.fixture(scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels,
              other_tiny_models: TinyModels, llama_binary: Path) -> AsyncIterator[Lab]:
    root = tmp_path_factory.mktemp("tiers")
    store = slotstore.SlotStore(root / "slots")
    accepted = llamacpp.help_flags(llama_binary)
    shapes = {"a": (tiny_models.gguf, 2, "q8_0"), "b": (tiny_models.gguf, 2, "q8_0"),
              "c": (other_tiny_models.gguf, 2, "q8_0"), "d": (tiny_models.gguf, 4, "q8_0"),
              "e": (tiny_models.gguf, 2, "f16")}
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for name, (model, parallel, kv) in shapes.items():
            settings = cpu_settings(llama_model=model, llama_cache_type=kv)
            plan = server_plan(
                settings, llama_binary, role=f"test-tiers-{name}", ctx=4096, parallel=parallel,
                slot_dir=store.directory, cache_ram_mib=0, accepted=accepted)
            proc = await stack.enter_async_context(_process(root, plan))
            clients[name] = await stack.enter_async_context(
                LlamaClient(LlamaTarget.from_plan(plan, proc.log_path)))
        prompt = await prompt_of(clients["a"], PROMPT_TOKENS)
        yield Lab(store, root / "sha.json", prompt=prompt, **clients)


def _process(root: Path, plan: EnginePlan) -> EngineProcess:
    return EngineProcess(plan, root / f"{plan.role}.log", run_dir=root, ready_timeout_s=READY_S)


async def test_save_erase_restore_round_trip(lab: Lab) -> None:
    a = lab.a
    cold = await a.chat(lab.prompt, slot=0)
    total = cold.timings["prompt_n"] + cold.timings["cache_n"]  # type: ignore[index]
    op, manifest = await slotstore.save(a, lab.store, 0, "round.bin", lab.hashes)
    path = lab.store.directory / "round.bin"
    assert op.n_tokens >= total and op.n_bytes == path.stat().st_size == manifest.file_bytes
    assert op.server_ms is not None and op.wall_ms > 0
    assert manifest.parallel == 2 and manifest.kv_type_k == "q8_0"
    assert manifest.server_build == "b1-0c1e570" and manifest.n_tokens == op.n_tokens
    # the store is private: directory 0700, slot file and manifest 0600
    assert lab.store.directory.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    assert lab.store.manifest_path("round.bin").stat().st_mode & 0o777 == 0o600

    assert (await a.erase(0)).n_tokens == op.n_tokens
    control = await a.chat(lab.prompt, slot=0)
    assert control.timings["cache_n"] == 0  # type: ignore[index]  # erased, and no RAM cache
    await a.erase(0)
    restored_op, _ = await slotstore.restore(a, lab.store, 0, "round.bin", lab.hashes)
    assert restored_op.n_tokens == op.n_tokens and restored_op.server_ms is not None
    again = await a.chat(lab.prompt, slot=0)
    assert again.timings["cache_n"] >= 0.95 * total  # type: ignore[index]
    gap = logprob_gap(cold.first_logprobs, again.first_logprobs)
    assert gap is not None and gap <= TOLERANCE


async def test_second_server_restores_and_reuses_with_equal_logprobs(lab: Lab) -> None:
    cold_a = await lab.a.chat(lab.prompt, slot=1)
    total = cold_a.timings["prompt_n"] + cold_a.timings["cache_n"]  # type: ignore[index]
    await slotstore.save(lab.a, lab.store, 1, "shared.bin", lab.hashes)
    await slotstore.restore(lab.b, lab.store, 0, "shared.bin", lab.hashes)
    on_b = await lab.b.chat(lab.prompt, slot=0)
    assert on_b.timings["cache_n"] >= 0.95 * total  # type: ignore[index]
    assert on_b.timings["prompt_n"] <= 0.05 * total  # type: ignore[index]
    gap = logprob_gap(cold_a.first_logprobs, on_b.first_logprobs)
    assert gap is not None and gap <= TOLERANCE
    await lab.b.erase(1)
    cold_b = await lab.b.chat(lab.prompt, slot=1)  # the control: B computing it itself
    assert cold_b.timings["cache_n"] == 0  # type: ignore[index]
    assert logprob_gap(cold_a.first_logprobs, cold_b.first_logprobs) <= TOLERANCE  # type: ignore[operator]


async def test_file_from_another_model_is_refused_by_the_manifest(lab: Lab) -> None:
    await lab.a.chat(lab.prompt, slot=0)
    await slotstore.save(lab.a, lab.store, 0, "model-a.bin", lab.hashes)
    with pytest.raises(RefusedError, match="model_sha256 differs") as err:
        await slotstore.restore(lab.c, lab.store, 0, "model-a.bin", lab.hashes)
    assert "wrong logits" in str(err.value)
    # why: llama-server itself takes the foreign file (same shapes) without a word
    raw = await lab.c.restore(0, "model-a.bin")
    assert raw.n_tokens > 0


async def test_parallel_mismatch_is_refused_and_the_log_reason_is_read(lab: Lab) -> None:
    await lab.a.chat(lab.prompt, slot=0)
    await slotstore.save(lab.a, lab.store, 0, "par2.bin", lab.hashes)
    with pytest.raises(RefusedError, match=r"n_stream differs.*--parallel"):
        await slotstore.restore(lab.d, lab.store, 0, "par2.bin", lab.hashes)
    # bypassing the manifest: the server's generic 400 becomes the reason from its log
    with pytest.raises(EngineError, match="n_stream mismatch") as err:
        await lab.d.restore(0, "par2.bin")
    assert "\n" not in str(err.value)


async def test_bad_names_missing_files_and_slot_ids(lab: Lab) -> None:
    await lab.a.chat(lab.prompt, slot=0)
    held = (await lab.a.slots())[0]["n_prompt_tokens"]
    with pytest.raises(InputError, match=r"slot file missing\.bin is not in"):
        await slotstore.restore(lab.a, lab.store, 0, "missing.bin", lab.hashes)
    # refused before the server saw it: a failed restore would have emptied the slot
    assert (await lab.a.slots())[0]["n_prompt_tokens"] == held > 0
    for call in (slotstore.restore, slotstore.save):
        with pytest.raises(RefusedError, match="bare name"):
            await call(lab.a, lab.store, 0, "../x.bin", lab.hashes)
    assert not (lab.store.directory.parent / "x.bin").exists()
    with pytest.raises(RefusedError, match=r"slot 2 does not exist.*ids 0-1"):
        await slotstore.save(lab.a, lab.store, 2, "wrap.bin", lab.hashes)
    await lab.a.save(0, "unrecorded.bin")  # saved behind kvlab's back: no manifest
    with pytest.raises(RefusedError, match="no kvlab manifest"):
        await slotstore.restore(lab.a, lab.store, 0, "unrecorded.bin", lab.hashes)


async def test_quantised_kv_changes_outputs(lab: Lab) -> None:
    q8_a = await lab.a.chat(lab.prompt, slot=1)
    q8_b = await lab.b.chat(lab.prompt, slot=1)
    f16 = await lab.e.chat(lab.prompt, slot=1)
    same = logprob_gap(q8_a.first_logprobs, q8_b.first_logprobs)
    changed = logprob_gap(q8_a.first_logprobs, f16.first_logprobs)
    assert same is not None and changed is not None
    assert same <= 1e-6 < changed


def kvlab(*args: str, env: dict[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, check=False, env={**os.environ, **(env or {})},
                          timeout=timeout)


def test_llama_cli_save_erase_restore_slots(lab: Lab) -> None:
    port = lab.a.target.base_url.rsplit(":", 1)[1]
    env = {"LLAMA_SLOT_SAVE_PATH": str(lab.store.directory)}
    save = kvlab("llama", "save", "0", "cli.bin", "--port", port, "--json", env=env)
    assert save.returncode == 0, save.stderr
    saved = json.loads(save.stdout)
    assert saved["action"] == "save" and saved["server_ms"] > 0 and saved["wall_ms"] > 0
    assert saved["manifest"]["model_sha256"] and saved["config_source"] == "settings"
    erase = json.loads(kvlab("llama", "erase", "0", "--port", port, "--json", env=env).stdout)
    assert erase["n_tokens"] == saved["n_tokens"]
    restore = kvlab("llama", "restore", "0", "cli.bin", "--port", port, "--json", env=env)
    assert restore.returncode == 0, restore.stderr
    assert json.loads(restore.stdout)["n_tokens"] == saved["n_tokens"]
    slots = json.loads(kvlab("llama", "slots", "--port", port, "--json", env=env).stdout)
    assert len(slots["slots"]) == 2
    assert any(f["filename"] == "cli.bin" and f["manifest"] for f in slots["files"])
    for args, words in ((("restore", "5", "cli.bin"), "slot 5 does not exist"),
                        (("restore", "0", "../x.bin"), "bare name"),
                        (("restore", "0", "gone.bin"), "gone.bin is not in")):
        bad = kvlab("llama", *args, "--port", port, env=env)
        assert bad.returncode == 2 and words in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def run_lab(tmp_path: Path, tiny_models: TinyModels, llama_binary: Path,
            **values: object) -> RunLab:
    """A `kvlab run` context on the tiny model, its notebook and slot store under tmp_path."""
    return RunLab(cpu_settings(llama_model=tiny_models.gguf, llama_bin=str(llama_binary),
                               labbook=str(tmp_path / "book.md"),
                               llama_slot_save_path=str(tmp_path / "slots"), **values))


async def test_run_disk_done_criterion(tmp_path: Path, tiny_models: TinyModels,
                                       llama_binary: Path) -> None:
    book, store = tmp_path / "book.md", tmp_path / "slots"
    run = run_lab(tmp_path, tiny_models, llama_binary)
    written = await disk.run(run, disk.DiskSpec(prompt_tokens=3000))
    assert len(written) == 1 and written[0] in run.written
    assert [r.line()["record"] for r in run.written] == ["startup", "disk"]
    record = written[0].line()
    assert record["record"] == "disk" and record["run_id"] == run.run_id
    assert record["verdict"] == "reuse proven", record["reasons"]
    assert record["prompt_tokens"] >= 3000
    assert record["evidence"]["control"]["cache_n"] == 0
    assert record["post_restore_cached_tokens"] >= 0.95 * record["prompt_tokens"]
    assert record["restore_cold_ratio"] < 0.05
    assert record["server"]["cache_ram_mib"] == 0 and record["server"]["tokens_per_slot"] >= 3000
    assert record["kv_cache_type"] == "q8_0" and record["kv_quantised"] is True
    lines = notebook.read(book).of(DiskRecord)
    assert len(lines) == 1 and lines[0].file_bytes == record["file_bytes"] > 0
    assert list(store.iterdir()) == []  # the experiment's slot file does not linger


async def test_run_shared_slots_writes_a_reuse_line(tmp_path: Path, tiny_models: TinyModels,
                                                    llama_binary: Path) -> None:
    book = tmp_path / "book.md"
    run = run_lab(tmp_path, tiny_models, llama_binary, llama_cache_type="f16")
    written = await slot_share.run(run, slot_share.SharedSlotsSpec(prompt_tokens=600, ctx=4096))
    assert len(written) == 1
    record = written[0].line()
    assert record["record"] == "reuse" and record["verdict"] == "reuse proven"
    assert len(set(record["endpoints"])) == 2 and [r["turn"] for r in record["rows"]] == [1, 2]
    assert record["kv_quantised"] is False
    evidence = notebook.read(book).of(ReuseRecord, "shared-slots")[0].evidence
    assert evidence is not None and evidence.logprob_max_abs_diff is not None
    assert evidence.logprob_max_abs_diff <= TOLERANCE


async def test_run_interference_writes_two_rows_and_a_comparison(
        tmp_path: Path, tiny_models: TinyModels, llama_binary: Path) -> None:
    book = tmp_path / "book.md"
    run = run_lab(tmp_path, tiny_models, llama_binary)
    spec = interference.InterferenceSpec(requests=4, max_tokens=4, ctx=2048, prompt_set="mixed")
    written = await interference.run(run, spec)
    assert [r.record for r in written] == ["load", "load", "comparison"]
    read = notebook.read(book)
    rows = read.of(LoadRecord)
    assert [r.label for r in rows] == ["interference-parallel-4", "interference-parallel-1"]
    assert [r.llama_parallel for r in rows] == [4, 1]
    for r in rows:
        assert r.concurrency == 4 and r.failed == 0 and r.ok == 4
        assert r.ttft_s is not None and r.ttft_s.p50 is not None
        assert r.ttft_s.p50 > 0 and r.prompt_set == "mixed"
        assert r.server is not None and r.llama_parallel is not None
        assert r.server.tokens_per_slot == 2048 // r.llama_parallel
    comparison = read.of(ComparisonRecord)
    assert len(comparison) == 1 and comparison[0].same_experiment is True
    ratio = comparison[0].levels[0].ttft_p50_ratio
    assert ratio is not None and ratio > 0
    if seeds.SEEDS.is_dir():  # the seed's own compare-disagg.py reads the rows unchanged
        seed = seed_compare(book, tmp_path)
        assert seed.returncode == 0, seed.stderr
        assert "interference-parallel-1 against interference-parallel-4" in seed.stdout


async def test_run_interference_repeats_alternate_and_pool_in_the_comparison(
        tmp_path: Path, tiny_models: TinyModels, llama_binary: Path) -> None:
    """--repeat 3: the order is 4 1 1 4 4 1, each row numbered, and the
    comparison's intervals pool the three repeats of each side."""
    book = tmp_path / "book.md"
    run = run_lab(tmp_path, tiny_models, llama_binary)
    spec = interference.InterferenceSpec(requests=6, max_tokens=4, ctx=2048, prompt_set="mixed",
                                         repeat=3)
    written = await interference.run(run, spec)
    rows = [r for r in written if isinstance(r, LoadRecord)]
    assert [r.record for r in written].count("load") == len(rows)
    assert [(r.llama_parallel, r.repeat) for r in rows] == [
        (4, 0), (1, 0), (1, 1), (4, 1), (4, 2), (1, 2)]
    level = written[-1].line()["levels"][0]
    assert level["repeats"] == 3
    ttft = level["intervals"]["ttft_p50"]
    # 6 requests a repeat; a random-weight reply that ends at once has no first token
    assert ttft["repeats"] == [3, 3] and all(15 <= n <= 18 for n in ttft["requests"]), ttft
    # a line leaves out what is None
    assert ttft.get("low") is not None and ttft["low"] <= ttft["ratio"] <= ttft["high"]
    assert notebook.read(book).foreign_lines == 0


def seed_compare(book: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = seeds.extract("compare-disagg.py", tmp_path)
    return subprocess.run([sys.executable, str(script), "--labbook", str(book), "--disagg",
                           "interference-parallel-1", "--baseline", "interference-parallel-4",
                           "--print-only"], capture_output=True, text=True, check=False)


def test_llama_serve_checks_flags_against_help(tmp_path: Path, tiny_models: TinyModels) -> None:
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '--model --alias --host --port --ctx-size --parallel "
                    "--n-gpu-layers --cache-prompt --cache-type-k --cache-type-v --metrics'\n")
    fake.chmod(0o755)
    result = kvlab("llama", "serve", env={"LLAMA_BIN": str(fake.parent),
                                          "LLAMA_MODEL": tiny_models.gguf})
    assert result.returncode == 2
    assert "does not accept --slot-save-path, --slots" in result.stderr


def _save_what_serve_started(tmp_path: Path, env: dict[str, str], port: str) -> None:
    """Once `kvlab llama serve` is up: a request, then `kvlab llama save` from a shell whose
    LLAMA_CACHE_TYPE differs."""
    deadline = time.monotonic() + 60
    while not (tmp_path / "b.md").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2})
    saved = subprocess.run([sys.executable, "-m", "kvlab", "llama", "save", "0", "s.bin",
                            "--port", port, "--json"], env={**env, "LLAMA_CACHE_TYPE": "f16"},
                           capture_output=True, text=True, check=False)
    assert saved.returncode == 0, saved.stderr
    manifest = json.loads(saved.stdout)["manifest"]
    # taken from what serve started, not from this shell's LLAMA_CACHE_TYPE
    assert (manifest["kv_type_k"], manifest["flash_attn"], manifest["parallel"]) == \
        ("q4_0", "on", 1)
    assert (tmp_path / "home" / "run" / "llama" / f"{port}.json").is_file()


def test_llama_serve_foreground_leaves_a_record_for_save(tmp_path: Path, tiny_models: TinyModels,
                                                         llama_binary: Path) -> None:
    from kvlab.engines.ports import free_port

    port = str(free_port())
    env = {**os.environ, "LLAMA_MODEL": tiny_models.gguf, "LLAMA_BIN": str(llama_binary),
           "LLAMA_SLOT_SAVE_PATH": str(tmp_path / "slots"), "LABBOOK": str(tmp_path / "b.md"),
           "KVLAB_HOME": str(tmp_path / "home"), "LLAMA_CACHE_TYPE": "q4_0"}
    with running([sys.executable, "-m", "kvlab", "llama", "serve", "--port", port,
                  "--parallel", "1", "--", "-fa", "on"], env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True) as child:
        try:
            _save_what_serve_started(tmp_path, env, port)
        finally:
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "-ctk / -ctv" in out and "slot save path" in out
    assert not (tmp_path / "home" / "run" / "llama" / f"{port}.json").exists()
