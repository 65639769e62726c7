"""Random prompts sent as text (`--prompt-form text`), the form `vllm bench serve` sends.

Each random prompt's token ids (drawn from the pool as for `--prompt-form ids`) become text by
the served model's own detokenizer (the engine adapter's `detokenize`: each engine's endpoint
and body live in its package), once, before the requests that carry them are built: a level's
warm-up prompts before its warm-up, its measured prompts before its first /metrics scrape, so
nothing here runs while a request is timed. A timed level therefore sends the requests it
prebuilt and builds none while it runs. The server tokenizes the text again inside each
request's TTFT, as it does vllm bench's prompts, and may count a few tokens more or fewer than
were drawn: the rows count what it says (`usage.prompt_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import httpx

from kvlab.core import EngineError, InputError
from kvlab.engines import engine_for
from kvlab.loadgen.trace import server_roots

SAMPLE_TOKENS = 16  # of the pool, to find the server that detokenizes


def _client(api_key: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(timeout=30.0, trust_env=False, headers=headers)


@dataclass(frozen=True)
class Detokenizer:
    """The server whose /detokenize turns a prompt's token ids into its text."""

    engine: str
    root: str
    model: str
    api_key: str = field(default="", repr=False)

    async def texts(self, prompts: Sequence[list[int]]) -> list[str]:
        """Each prompt's text, in order."""
        async with _client(self.api_key) as client:
            return [await self._one(client, tokens) for tokens in prompts]

    async def _one(self, client: httpx.AsyncClient, tokens: list[int]) -> str:
        text = await engine_for(self.engine).detokenize(client, self.root, self.model, tokens)
        if text is None:
            raise EngineError(f"--prompt-form text: {self.root}/detokenize stopped answering "
                              "before the level started")
        return text


async def detokenizer(engine: str, urls: Iterable[str], model: str, sample: list[int],
                      api_key: str = "") -> Detokenizer:
    """The first server whose /detokenize turns `sample` into text; refused without one."""
    roots = server_roots(urls)
    async with _client(api_key) as client:
        for root in roots:
            if await engine_for(engine).detokenize(client, root, model, sample) is not None:
                return Detokenizer(engine, root, model, api_key)
    raise InputError(f"--prompt-form text: no /detokenize answered "
                     f"({', '.join(roots) or 'no server'}); text prompts are the served "
                     "model's detokenizer's: give --tokenize-url the engine's URL, or "
                     "--prompt-form ids")
