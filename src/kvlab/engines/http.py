"""The JSON calls the engine adapters make: tolerant probes (None instead of an error) and
one strict call for a step that must not pass on a failure (a checked reset)."""

from __future__ import annotations

import contextlib

import httpx

from kvlab.core import dig, integer


async def get_json(client: httpx.AsyncClient, url: str) -> dict[str, object] | None:
    """The JSON object at `url`, or None (no answer, not 200, not an object)."""
    try:
        response = await client.get(url)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


async def post_json(client: httpx.AsyncClient, url: str,
                    payload: dict[str, object]) -> dict[str, object] | None:
    """The JSON object answered to a POST of `payload`, or None."""
    try:
        response = await client.post(url, json=payload)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


async def post_tokens(client: httpx.AsyncClient, url: str,
                      payload: dict[str, object]) -> list[int] | None:
    """The "tokens" list a /tokenize answers to a POST of `payload` (both engines name it so),
    or None."""
    body = await post_json(client, url, payload)
    tokens = body.get("tokens") if body else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens


async def post_strict(client: httpx.AsyncClient, url: str,
                      payload: dict[str, object] | None) -> dict[str, object]:
    """The JSON object answered to a POST (empty when the answer is no object); httpx's
    error when the server fails or refuses it."""
    response = (await client.post(url, json=payload)).raise_for_status()
    with contextlib.suppress(ValueError):
        found = response.json()
        return found if isinstance(found, dict) else {}
    return {}


async def openai_cached(client: httpx.AsyncClient, model: str, prompt: str) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of one one-token completion of `prompt`, from the
    OpenAI usage's `prompt_tokens_details.cached_tokens` (httpx's error on a failure)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    usage = dig(await post_strict(client, "/v1/completions", body), "usage")
    return (integer(dig(usage, "prompt_tokens")) or 0,
            integer(dig(usage, "prompt_tokens_details", "cached_tokens")) or 0)
