"""Prompt sizes in the served model's own tokens, counted by the engine's /tokenize.

Before a sweep's first level, `prompt_sizing` drives `workloads.calibrate` with the engine
adapter's `tokenize` (each engine's endpoint and body live in its package): tokens per word
from a long sample, then the shared preamble fitted to the token. It asks the servers given in
order (the base URL's first; a proxy has no /tokenize, so the engine behind it comes next) and
falls back to the word estimate (`workloads.TOKENS_PER_WORD`) only when none answers; the
returned `Sizing` says which was used and where it was counted. `longest_prompt` counts the
largest level's longest prompts the same way, their template applied (`fit.py` sets them
against the served context). Nothing here runs while a level is measured.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import httpx

from kvlab.engines import engine_for
from kvlab.loadgen import workloads
from kvlab.loadgen.payloads import level_prompts
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.trace import server_roots
from kvlab.loadgen.workloads import Sizing

Count = Callable[[str], Awaitable[int | None]]
SAMPLE = 2000  # prompts of the largest level looked at (every turn of its conversations)
COUNTED = 3  # of those, the longest by characters, counted by the server


def tokenize_urls(spec: LoadSpec) -> list[str]:
    """Where the prompts' tokens are counted, in order of preference."""
    return [spec.tokenize_url or spec.base_url, spec.metrics_url]


async def size_with_async(count: Count, seed: int, preamble_tokens: int,
                          source: str) -> Sizing | None:
    """`workloads.calibrate` driven by an async counter (None from it: no sizing)."""
    steps = workloads.calibrate(seed, preamble_tokens, source)
    try:
        text = next(steps)
        while True:
            n = await count(text)
            if n is None:
                return None
            text = steps.send(n)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _counter(engine: str, client: httpx.AsyncClient, root: str) -> Count:
    adapter = engine_for(engine)

    async def count(text: str) -> int | None:
        tokens = await adapter.tokenize(client, root, text)
        return len(tokens) if tokens is not None else None
    return count


async def prompt_sizing(engine: str, urls: Iterable[str], seed: int, preamble_tokens: int,
                        client: httpx.AsyncClient) -> Sizing:
    """The sizing counted by the first server that tokenizes, else the word estimate."""
    roots = server_roots(urls)
    for root in roots:
        found = await size_with_async(_counter(engine, client, root), seed, preamble_tokens,
                                      f"{engine} tokenizer at {root}")
        if found is not None:
            return found
    tried = ", ".join(roots) or "no server"
    return Sizing(source=f"TOKENS_PER_WORD: no tokenizer endpoint answered ({tried})")


async def longest_prompt(client: httpx.AsyncClient, spec: LoadSpec, engine: str,
                         sizing: workloads.Sizing) -> tuple[int, str] | None:
    """The longest prompt of the largest level in the server's own tokens, and who counted
    it; None when no tokenizer endpoint answers."""
    index = max(range(len(spec.points())), key=lambda i: spec.floor(spec.points()[i][0]))
    count = min(SAMPLE, spec.floor(spec.points()[index][0]))
    prompts = level_prompts(spec, index, max(count, workloads.DEFAULT_TURNS), sizing=sizing)
    longest = sorted(prompts, key=lambda p: len(p.as_text()), reverse=True)[:COUNTED]
    adapter = engine_for(engine)
    for root in server_roots(tokenize_urls(spec)):
        counts = []
        for prompt in longest:
            tokens = (await adapter.tokenize_chat(client, root, spec.model,
                                                  prompt.as_messages())
                      if spec.endpoint == "chat"
                      else await adapter.tokenize(client, root, prompt.as_text()))
            if tokens is None:
                break
            counts.append(len(tokens))
        else:
            return max(counts), f"{engine} tokenizer at {root}"
    return None
