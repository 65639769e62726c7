"""`kvlab check` on real engines: instances that compute different numbers are refused, by
field where the engine says it and by the behavioural fingerprint where it does not; the same
model is never refused (another instance, another path, another run, a restart).

Calibration of `fingerprint.TOLERANCE` lives here: every agreeing pair must measure exactly
0, and every changed pair (dtype, KV quantisation, weight seed) must exceed the tolerance.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from integration.conftest import cpu_settings
from kvlab.core.errors import RefusedError
from kvlab.engines import PlanRequest, llamacpp, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.measure import compat
from kvlab.measure.prove import ProveOptions, run_proof
from kvlab.observe import fingerprint
from lora import write_adapter

pytestmark = pytest.mark.vllm


# ---- llama-server: starts in seconds, so each case gets its own servers ------------------

def _llama(binary: Path, tmp: Path, model: str, kv: str = "f16") -> EnginePlan:
    settings = cpu_settings(llama_slot_save_path=str(tmp / "slots"), llama_model=model)
    return llamacpp.plan(settings, binary, llamacpp.LlamaOptions(port=free_port(),
                                                                 cache_type=kv))


@pytest.fixture
def gguf_copy(tiny_models: TinyModels, tmp_path: Path) -> Iterator[str]:
    """An unedited copy of the tiny GGUF at another path."""
    copy = tmp_path / "elsewhere" / "same-model.gguf"
    copy.parent.mkdir()
    shutil.copy(tiny_models.gguf, copy)
    yield str(copy)


async def test_the_same_model_agrees_across_runs_paths_and_a_restart(
        tiny_models: TinyModels, llama_binary: Path, tmp_path: Path, gguf_copy: str) -> None:
    a = _llama(llama_binary, tmp_path, tiny_models.gguf)
    b = _llama(llama_binary, tmp_path, gguf_copy)
    urls = [a.base_url, b.base_url]
    async with EngineProcess(a, tmp_path / "a.log"):
        async with EngineProcess(b, tmp_path / "b.log"):
            first = await compat.compare(urls)
            again = await compat.compare(urls)  # repeated runs: the probe is never cached
        async with EngineProcess(b, tmp_path / "b2.log"):  # B restarted
            restarted = await compat.compare(urls)
    for result in (first, again, restarted):
        assert result.compatible, result.refusal()
        fa, fb = (f.fingerprint for f in result.instances)
        assert fa is not None and fb is not None
        assert fingerprint.distance(fa, fb).value == 0.0
    # identity is content: a different path is a note
    assert any("different paths" in n and "the content is the same" in n for n in first.notes)
    assert first.instances[0].content_digest == first.instances[1].content_digest


async def test_a_quantised_kv_cache_is_refused_even_unseen(tiny_models: TinyModels,
                                                           llama_binary: Path,
                                                           tmp_path: Path) -> None:
    f16 = _llama(llama_binary, tmp_path, tiny_models.gguf)
    q8 = _llama(llama_binary, tmp_path, tiny_models.gguf, kv="q8_0")
    async with EngineProcess(f16, tmp_path / "f16.log"), \
            EngineProcess(q8, tmp_path / "q8.log"):
        result = await compat.compare([f16.base_url, q8.base_url])
        # as if the command lines could not be read (another machine): the numbers still tell
        blind = await compat.compare([f16.base_url, q8.base_url], ignore=("cache_dtype",))
        cli = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "kvlab", "check", f16.base_url,
                             q8.base_url, "--json"], capture_output=True, text=True,
            timeout=120, check=False)
    fields = [m.field for m in result.mismatches]
    assert fields == ["cache_dtype", "fingerprint"], fields
    assert "f16" in result.refusal() and "q8_0" in result.refusal()
    assert [m.field for m in blind.mismatches] == ["fingerprint"]
    assert blind.refusal().startswith("numerics differ (behavioural fingerprint)")
    # `check --json` prints its one document when it refuses, and exits 2
    assert cli.returncode == 2, cli.stderr
    doc = json.loads(cli.stdout)
    assert doc["compatible"] is False and doc["mismatches"][0]["field"] == "cache_dtype"
    assert cli.stderr.startswith("kvlab: instances disagree on cache_dtype")


async def test_another_weight_seed_is_refused_by_its_numbers(tiny_models: TinyModels,
                                                             other_tiny_models: TinyModels,
                                                             llama_binary: Path,
                                                             tmp_path: Path) -> None:
    a = _llama(llama_binary, tmp_path, tiny_models.gguf)
    b = _llama(llama_binary, tmp_path, other_tiny_models.gguf)
    async with EngineProcess(a, tmp_path / "a.log"), EngineProcess(b, tmp_path / "b.log"):
        result = await compat.compare([a.base_url, b.base_url],
                                      ignore=("content_digest", "template_tokens"))
    assert [m.field for m in result.mismatches] == ["fingerprint"]
    fa, fb = (f.fingerprint for f in result.instances)
    assert fa is not None and fb is not None
    assert fingerprint.distance(fa, fb).value > 100 * fingerprint.TOLERANCE


# ---- vLLM: three instances started once (a store pair and a float32 one) ------------------

def _vllm(install: vllm.VllmInstall, model: str, role: str, store: Path, core: int,
          *extra: str) -> EnginePlan:
    settings = cpu_settings(model=model, kv_shared_path=str(store))
    return vllm.plan(settings, role, install, PlanRequest(
        port=free_port(), cpu_core=core, extra_args=extra))


@pytest.fixture(scope="module")
async def trio(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[list[str]]:
    """A (bf16, the model, store S1), B (bf16, a copy of the model at another path whose chat
    template gained a comment, store S1), C (float32, the model, another store S2)."""
    tmp = tmp_path_factory.mktemp("trio")
    copy = tmp / "copy-of-hf"
    shutil.copytree(tiny_models.hf, copy)
    template = copy / "chat_template.jinja"  # edited where it renders nothing (#48, finding 5)
    template.write_text("{#- kept by the ops team -#}\n  " + template.read_text())
    s1, s2 = tmp / "store-1", tmp / "store-2"
    plans = [_vllm(vllm_install, tiny_models.hf, "shared-a", s1, 0),
             _vllm(vllm_install, str(copy), "shared-b", s1, 1),
             _vllm(vllm_install, tiny_models.hf, "shared-b", s2, 0, "--dtype", "float32")]
    procs = [EngineProcess(p, tmp / f"{p.port}.log") for p in plans]
    for proc in procs:
        proc.start()
    try:
        await asyncio.gather(*(proc.wait_ready() for proc in procs))
        yield [p.base_url + "/v1" for p in plans]
    finally:
        await asyncio.gather(*(proc.stop() for proc in procs))


async def test_vllm_copy_at_another_path_sharing_a_store_is_compatible(trio: list[str]
                                                                        ) -> None:
    a, b, _ = trio
    result = await compat.compare([a, b])
    assert result.compatible, result.refusal()
    assert any("different paths" in n for n in result.notes)
    assert ("chat_template.jinja differs, yet both servers render the same template tokens: a "
            "note, not a refusal") in result.notes, result.notes
    fa, fb = (f.fingerprint for f in result.instances)
    assert fa is not None and fb is not None and fingerprint.distance(fa, fb).value == 0.0
    facts = result.instances[0]
    assert facts.dtype == "bfloat16" and facts.kv_store is not None
    assert "ExampleConnector" in facts.kv_store


async def test_vllm_float32_against_bfloat16_is_refused(trio: list[str]) -> None:
    a, _, c = trio
    result = await compat.compare([a, c])
    fields = [m.field for m in result.mismatches]
    # the facts differ and both run a connector: no prompt is sent that one might load from
    # the other's store, so no fingerprint is taken
    assert fields == ["dtype", "kv_store"], fields
    assert all(f.fingerprint is None for f in result.instances)
    line = result.refusal()
    assert "bfloat16" in line and "float32" in line and "store-1" in line and "store-2" in line
    # what vLLM's /metrics says alone agrees ("auto" KV dtype on both): the numbers do not
    assert {f.cache_dtype for f in result.instances} == {"auto"}
    blind = await compat.compare([a, c], ignore=("dtype", "kv_store"))
    assert [m.field for m in blind.mismatches] == ["fingerprint"]
    fa, fc = (f.fingerprint for f in blind.instances)
    assert fa is not None and fc is not None
    assert fingerprint.distance(fa, fc).value > 10 * fingerprint.TOLERANCE


async def test_prove_names_the_store_that_differs(trio: list[str]) -> None:
    a, _, c = trio
    with pytest.raises(RefusedError) as err:
        await run_proof(ProveOptions([a, c], "local-chat", preamble_words=200, connector="shared",
                                 ignore=("dtype", "fingerprint")))
    assert str(err.value).startswith("instances disagree on kv_store")
    assert "store-1" in str(err.value) and "store-2" in str(err.value)


def test_check_first_line_for_the_dtype_pair(trio: list[str]) -> None:
    a, _, c = trio
    run = subprocess.run([sys.executable, "-m", "kvlab", "check", a, c], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert run.stderr.startswith("kvlab: instances disagree on dtype")
    assert "MISMATCH" in run.stdout and "bfloat16" in run.stdout


def test_logprobs_are_served(trio: list[str]) -> None:
    """The probe's request shape is one vLLM accepts (a 400 here would make every
    fingerprint None and the check blind)."""
    body = fingerprint.probe_body("local-chat")
    answer = httpx.post(trio[0] + "/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert fingerprint.parse(answer.json()) is not None


# ---- vLLM: a LoRA adapter served under the clients' model name (#48 finding 6) ------------

async def test_a_lora_adapter_under_the_clients_name_is_refused(
        tiny_models: TinyModels, vllm_install: vllm.VllmInstall, tmp_path: Path) -> None:
    """A (the model as `local-chat`) against B (the model as `tiny-base`, with a LoRA adapter
    served as `local-chat`): `check --ignore model_id` said "compatible", its probe sent under
    B's base name while clients' `local-chat` reached the adapter (logprobs -7.228 against
    -7.117)."""
    adapter = write_adapter(tiny_models.hf, tmp_path / "adapter")
    plans = [vllm.plan(cpu_settings(model=tiny_models.hf), "baseline", vllm_install,
                       PlanRequest(port=free_port(), cpu_core=0)),
             vllm.plan(cpu_settings(model=tiny_models.hf, served_name="tiny-base"), "baseline",
                       vllm_install, PlanRequest(port=free_port(), cpu_core=1, extra_args=(
                           "--enable-lora", "--max-lora-rank", "8",
                           "--lora-modules", f"local-chat={adapter}")))]
    procs = [EngineProcess(p, tmp_path / f"{p.port}.log") for p in plans]
    for proc in procs:
        proc.start()
    try:
        await asyncio.gather(*(proc.wait_ready() for proc in procs))
        a, b = (p.base_url + "/v1" for p in plans)
        found = await compat.compare([a, b], ignore=("model_id",))
        blind = await compat.compare([a, b], ignore=("model_id", "adapters"))
        run = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "kvlab", "check", a, b, "--ignore", "model_id"],
            capture_output=True, text=True, timeout=120, check=False)
    finally:
        await asyncio.gather(*(proc.stop() for proc in procs))
    assert [m.field for m in found.mismatches][:1] == ["adapters"], found.refusal()
    fa, fb = found.instances
    assert (fa.adapters, fb.adapters) == ([], ["local-chat (LoRA on tiny-base)"])
    assert fb.model_id == "tiny-base"
    # the probe went under the name clients send, which reaches the adapter on B
    assert [m.field for m in blind.mismatches] == ["fingerprint"], blind.refusal()
    assert {f.probed_as for f in blind.instances} == {"local-chat"}
    assert run.returncode == 2 and run.stderr.startswith("kvlab: instances disagree on adapters")
    assert "local-chat (LoRA on tiny-base)" in run.stderr
