"""An engine that dies mid-request is a failure with its cause, never a timing or a verdict
(#48 findings 3 and 12: `prove` printed `TTFT 0.000 s reused None` and `silent-miss` for two
instances whose store had filled and killed them). The fake upstream dies on cue: vLLM's
error event in the stream (its engine core gone), or an end with no finish_reason."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core import EngineError
from kvlab.measure import ProveOptions, run_proof
from kvlab.observe import chat_body, stream_chat

WORDS = {"error": "failed mid-stream after 2 tokens: EngineCore encountered an issue",
         "cut": "ended the stream after 2 tokens with no finish_reason and no [DONE]: the "
                "engine stopped mid-request"}


@pytest.mark.parametrize("how", sorted(WORDS))
async def test_a_stream_that_is_no_answer_is_an_error_with_its_cause(how: str) -> None:
    async with SseUpstream(Behaviour(tokens=4, die_after=2, die_how=how)) as up, \
            httpx.AsyncClient() as client:
        with pytest.raises(EngineError) as err:
            await stream_chat(client, up.base_url, chat_body("fake", [], 4))
    assert WORDS[how] in str(err.value)


@pytest.mark.parametrize("how", sorted(WORDS))
async def test_prove_against_a_dying_engine_gives_no_verdict(how: str) -> None:
    # the warm-up and the cold request answer; the engine dies on the identical repeat
    dying = Behaviour(tokens=4, die_after=2, die_how=how, die_from=3, models=("fake",))
    async with SseUpstream(dying) as up:
        with pytest.raises(EngineError, match="mid-"):
            await run_proof(ProveOptions([up.base_url], "fake", preamble_words=40))


async def test_the_cli_says_the_cause_and_exits_non_zero() -> None:
    dying = Behaviour(tokens=4, die_after=2, die_how="error", die_from=3, models=("fake",))
    async with SseUpstream(dying) as up:
        done = await _run(["prove", "--base-url", up.base_url, "--model", "fake",
                           "--preamble-words", "40"])
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "EngineCore encountered an issue" in done.stderr
    assert "silent-miss" not in done.stdout + done.stderr
    assert "TTFT 0.000" not in done.stdout


async def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "kvlab", *args],
                                   capture_output=True, text=True, timeout=120, check=False)
