"""A reasoning model's first token is a reasoning token; its answer comes after the thinking.
The load generator times both apart, on real sockets, against a fake upstream that streams
the shapes vLLM documents for a reasoning parser (the role chunk, `delta.reasoning`, then
`delta.content`): none of our engines can, since the tiny model's tokenizer has no
`<think>`/`</think>` tokens and vLLM's reasoning parsers refuse to start without them."""

from __future__ import annotations

from pathlib import Path

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.sweep import LoadSpec, run_level
from kvlab.records import requests
from kvlab.records.models import LoadRecord
from kvlab.report.pd import ttft_cell

THINKING = 3  # tokens of reasoning before the answer


def spec(url: str, book: Path, label: str) -> LoadSpec:
    return LoadSpec(base_url=url, model="fake", levels=(1,), requests=4, max_tokens=6,
                    prompt_set="shared-prefix", label=label, preamble_tokens=40,
                    scrape_metrics=False, labbook=str(book), warmup=0)


async def level(book: Path, reasoning: int, label: str) -> LoadRecord:
    behaviour = Behaviour(reasoning=reasoning, ttft_s=0.005, itl_s=0.01)
    async with SseUpstream(behaviour) as up:
        s = spec(up.base_url, book, label)
        return await run_level(s, Endpoint.from_url(s.base_url), 1, 0)


async def test_the_first_answer_token_is_timed_apart_from_the_first_reasoning_token(
        tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    row = await level(book, THINKING, "thinks")
    assert row.ok == 4 and row.reasoning_requests == 4
    assert row.ttft_s is not None and row.ttft_answer_s is not None
    assert row.ttft_answer_s.n == 4
    # three reasoning tokens, 10 ms apart, come before the first answer token
    assert row.ttft_answer_s.p50 is not None and row.ttft_s.p50 is not None
    assert row.ttft_answer_s.p50 - row.ttft_s.p50 >= THINKING * 0.01 * 0.8
    assert row.requests_file is not None
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    for x in lines:
        assert x.ttft_reasoning_s == x.ttft_s
        assert x.ttft_answer_s is not None and x.ttft_s is not None
        assert x.ttft_answer_s > x.ttft_s
    cell = ttft_cell([row])
    assert "; first answer token " in cell and "after reasoning in 4 requests" in cell


async def test_a_model_that_does_not_reason_shows_one_ttft(tmp_path: Path) -> None:
    row = await level(tmp_path / "labbook.md", 0, "plain")
    assert row.reasoning_requests == 0
    assert row.ttft_s is not None and row.ttft_answer_s is not None
    assert row.ttft_answer_s.p50 == row.ttft_s.p50
    assert "first answer token" not in ttft_cell([row])
