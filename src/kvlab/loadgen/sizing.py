"""Prompt sizes in the served model's own tokens, counted by the engine's /tokenize.

Before a sweep's first level, `prompt_sizing` drives `workloads.calibrate` with the engine
adapter's `tokenize` (each engine's endpoint and body live in its package): tokens per word
from a long sample, then the shared preamble fitted to the token. It asks the servers given in
order (the base URL's first; a proxy has no /tokenize, so the engine behind it comes next) and
falls back to the word estimate (`workloads.TOKENS_PER_WORD`) only when none answers; the
returned `Sizing` says which was used and where it was counted. Nothing here runs while a
level is measured.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import httpx

from kvlab.engines import engine_for
from kvlab.loadgen.trace import server_roots
from kvlab.measure import Sizing, workloads

Count = Callable[[str], Awaitable[int | None]]


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
