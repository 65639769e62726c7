"""Slot manifests describe the server, not kvlab's settings (#35, finding 6), on real
llama-servers with the tiny GGUF, all with `--cache-ram 0` so no RAM cache stands in for a
restore.

- A file saved with flash attention left to the build (`auto`) restores into `-fa on`, and one
  saved with `--parallel 1 -kvu` into `--parallel 2 -kvu` (one stream each): no false alarm,
  and the restored slot answers with the saved one's logprobs.
- `--parallel 2` (two streams) into `--parallel 2 -kvu` (one) is refused by kvlab, naming
  n_stream (llama.cpp's own `n_stream mismatch`, which went through before).
- A server kvlab did not start, with f16 KV while the settings say q8_0: the manifest records
  f16 (its command line), so a restore into a real f16 server passes and one into a q8_0
  server is refused by kvlab (before: the reverse).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from children import async_running
from integration.conftest import cpu_settings
from kvlab.core.errors import RefusedError
from kvlab.engines import llamacpp
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget
from kvlab.engines.llamacpp.server import READY_S, prompt_of, server_plan
from kvlab.engines.models import TinyModels
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.observe.chat import logprob_gap

pytestmark = pytest.mark.llama
PROMPT_TOKENS = 300
TOLERANCE = 1e-3
SERVERS = {"np1kvu": (1, ("-kvu",)), "np2kvu_fa": (2, ("-kvu", "-fa", "on")),
           "np2": (2, ()), "np2_q8": (2, ("-ctk", "q8_0", "-ctv", "q8_0"))}


@dataclass
class Servers:
    store: slotstore.SlotStore
    hashes: Path
    clients: dict[str, LlamaClient]
    prompt: str


@pytest.fixture(scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels,
                  llama_binary: Path) -> AsyncIterator[Servers]:
    root = tmp_path_factory.mktemp("slotfacts")
    store = slotstore.SlotStore(root / "slots")
    store.ensure()
    accepted = llamacpp.help_flags(llama_binary)
    settings = cpu_settings(llama_model=tiny_models.gguf, llama_cache_type="f16")
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for name, (parallel, extra) in SERVERS.items():
            plan = server_plan(settings, llama_binary, role=f"facts-{name}", ctx=2048,
                               parallel=parallel, slot_dir=store.directory, cache_ram_mib=0,
                               accepted=accepted,
                               chosen=llamacpp.LlamaOptions(extra_args=extra))
            proc = await stack.enter_async_context(_process(root, plan))
            clients[name] = await stack.enter_async_context(
                LlamaClient(LlamaTarget.from_plan(plan, proc.log_path)))
        prompt = await prompt_of(clients["np2"], PROMPT_TOKENS)
        yield Servers(store, root / "sha.json", clients, prompt)


def _process(root: Path, plan: EnginePlan) -> EngineProcess:
    return EngineProcess(plan, root / f"{plan.role}.log", run_dir=root, ready_timeout_s=READY_S)


async def round_trip(lab: Servers, source: str, target: str, name: str) -> float:
    """Save slot 0 of `source` as `name`, restore it into slot 0 of `target` through the
    manifest's checks; the logprob gap of the next token between the two."""
    a, b = lab.clients[source], lab.clients[target]
    saved = await a.chat(lab.prompt, slot=0)
    await slotstore.save(a, lab.store, 0, name, lab.hashes)
    op, _ = await slotstore.restore(b, lab.store, 0, name, lab.hashes)
    path = lab.store.slot_path(name)
    started = time.perf_counter()
    hashlib.sha256(path.read_bytes()).hexdigest()
    print(f"{name}: {path.stat().st_size:,} bytes, sha256 {time.perf_counter() - started:.4f} s, "
          f"the server's restore {op.server_ms} ms")
    restored = await b.chat(lab.prompt, slot=0)
    assert restored.timings["cache_n"] > 0  # type: ignore[index]
    gap = logprob_gap(saved.first_logprobs, restored.first_logprobs)
    assert gap is not None
    return gap


async def test_auto_flash_attention_into_fa_on_and_one_stream_into_one_stream(
        servers: Servers) -> None:
    assert await round_trip(servers, "np1kvu", "np2kvu_fa", "kvu.bin") <= TOLERANCE
    saved = servers.store.read_manifest("kvu.bin")
    assert (saved.n_stream, saved.kv_unified, saved.parallel) == ("1", "true", 1)
    assert saved.flash_attn == "unknown"  # auto: the build resolves it and logs it at -lv 4
    assert (saved.kv_type_k, saved.kv_type_v) == ("f16", "f16")  # its command line's


async def test_two_streams_into_one_is_refused_naming_n_stream(servers: Servers) -> None:
    await servers.clients["np2"].chat(servers.prompt, slot=0)
    await slotstore.save(servers.clients["np2"], servers.store, 0, "np2.bin", servers.hashes)
    with pytest.raises(RefusedError, match=r"n_stream differs: the file was saved with "
                                           r"n_stream 2, this server has n_stream 1"):
        await slotstore.restore(servers.clients["np2kvu_fa"], servers.store, 0, "np2.bin",
                                servers.hashes)


async def test_a_server_kvlab_did_not_start_is_described_by_its_own_flags(
        servers: Servers, tiny_models: TinyModels, llama_binary: Path) -> None:
    port = free_port()
    argv = [str(llama_binary), "-m", tiny_models.gguf, "--host", "127.0.0.1", "--port",
            str(port), "--ctx-size", "2048", "--parallel", "2", "--cache-ram", "0",
            "--slot-save-path", str(servers.store.directory)]
    async with async_running(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        # what `kvlab llama save` knows of a server it did not start: the settings (q8_0)
        target = LlamaTarget(f"http://127.0.0.1:{port}", servers.store.directory,
                             kv_type_k="q8_0", kv_type_v="q8_0", source="settings")
        async with LlamaClient(target) as theirs:
            await _wait_health(theirs)
            await theirs.chat(servers.prompt, slot=0)
            await slotstore.save(theirs, servers.store, 0, "theirs.bin", servers.hashes)
    saved = servers.store.read_manifest("theirs.bin")
    assert (saved.kv_type_k, saved.kv_type_v, saved.n_stream) == ("f16", "f16", "2")
    await slotstore.restore(servers.clients["np2"], servers.store, 1, "theirs.bin",
                            servers.hashes)  # a real f16 server: no false alarm
    with pytest.raises(RefusedError, match=r"kv_type_k differs \(also kv_type_v\): the file "
                                           "was saved with kv_type_k f16, this server has "
                                           "kv_type_k q8_0"):
        await slotstore.restore(servers.clients["np2_q8"], servers.store, 0, "theirs.bin",
                                servers.hashes)


async def _wait_health(client: LlamaClient) -> None:
    for _ in range(600):
        with contextlib.suppress(Exception):
            if (await client.http.get("/health")).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise AssertionError("llama-server did not come up")
