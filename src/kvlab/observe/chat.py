"""One streamed chat request, timed, with the server's own reuse evidence.

TTFT is measured from just before the request is sent to the first streamed chunk carrying
content (the seed's definition), with `time.perf_counter`. When the first token ends the
answer (random weights sometimes emit end-of-text at once) there is no content: TTFT then
falls back to the first chunk that carries a choice, flagged in `ttft_from`. The last
chunk's `usage` (`stream_options.include_usage`) gives prompt, completion and cached tokens
(`prompt_tokens_details.cached_tokens`, which vLLM fills only with
`--enable-prompt-tokens-details`); llama-server adds `timings` (`cache_n` reused, `prompt_n`
computed). This module is for measuring single requests precisely, not for load: the load
generator has its own client.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from kvlab.core.errors import EngineError, UnreachableError
from kvlab.core.jsondata import JsonObject, dig, integer, items, number, obj
from kvlab.records.runs import ChatTiming


def api_base(url: str) -> str:
    """The OpenAI base URL (ending in /v1) for a server root or a /v1 URL."""
    root = url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


def server_root(url: str) -> str:
    return api_base(url).removesuffix("/v1")


@dataclass
class ChatResult:
    """What one streamed request showed, in canonical units (seconds, tokens)."""

    endpoint: str
    ttft_s: float | None
    total_s: float
    chunks: int
    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, float] | None = None  # llama-server's own, its numbers only
    first_logprobs: list[tuple[str, float]] = field(default_factory=list)
    first_choice_s: float | None = None
    ttft_from: str = "first content"

    @property
    def reused_tokens(self) -> int | None:
        """Prompt tokens the server says it did not compute (llama: cache_n)."""
        if self.timings and "cache_n" in self.timings:
            return int(self.timings["cache_n"])
        return self.cached_tokens

    def timing(self) -> ChatTiming:
        """The answer as a notebook row states it (seconds rounded to 0.1 ms)."""
        return ChatTiming(endpoint=self.endpoint,
                          ttft_s=round(self.ttft_s, 4) if self.ttft_s is not None else None,
                          total_s=round(self.total_s, 4), chunks=self.chunks,
                          prompt_tokens=self.prompt_tokens,
                          completion_tokens=self.completion_tokens,
                          cached_tokens=self.cached_tokens, timings=self.timings,
                          ttft_from=None if self.ttft_from == "first content" else self.ttft_from)


def chat_body(model: str, messages: list[dict[str, str]], max_tokens: int,
              temperature: float = 0.0, extra: JsonObject | None = None) -> JsonObject:
    """A streamed chat request that asks for usage in the last chunk (`extra`: more fields,
    e.g. cache_salt, slot_id)."""
    return {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}


async def stream_chat(client: httpx.AsyncClient, url: str, body: JsonObject,
                      api_key: str = "") -> ChatResult:
    """Send one streamed chat completion and time it; user-facing errors are KvlabErrors."""
    endpoint = api_base(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.perf_counter()
    result = ChatResult(endpoint=endpoint, ttft_s=None, total_s=0.0, chunks=0, text="")
    pieces: list[str] = []
    try:
        async with client.stream("POST", endpoint + "/chat/completions", json=body,
                                 headers=headers) as response:
            if response.status_code >= 400:
                detail = error_message((await response.aread()).decode("utf-8", "replace"))
                raise EngineError(f"{endpoint} answered HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                _absorb(line, result, pieces, started)
    except httpx.TimeoutException:
        raise UnreachableError(f"{endpoint} did not answer within the timeout") from None
    except httpx.HTTPError as exc:
        raise UnreachableError(f"{endpoint} did not answer: {exc}") from None
    result.total_s = time.perf_counter() - started
    result.text = "".join(pieces)
    if result.ttft_s is None and result.first_choice_s is not None:
        result.ttft_s, result.ttft_from = result.first_choice_s, "first chunk (no content)"
    return result


def error_message(body: str, limit: int = 400) -> str:
    """An engine's error in words: the message of its JSON error (vLLM and llama-server nest
    it under "error"), else the body; shortened at a word, never cut mid-JSON."""
    text = body
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        inner = doc.get("error", doc)
        found = inner.get("message") if isinstance(inner, dict) else inner
        text = str(found or doc.get("detail") or body)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def _absorb(line: str, result: ChatResult, pieces: list[str], started: float) -> None:
    if not line.startswith("data:"):
        return
    payload = line[5:].strip()
    if payload == "[DONE]":
        return
    try:
        chunk = obj(json.loads(payload))
    except json.JSONDecodeError:
        return
    if usage := obj(chunk.get("usage")):
        result.prompt_tokens = integer(usage.get("prompt_tokens"))
        result.completion_tokens = integer(usage.get("completion_tokens"))
        cached = integer(dig(usage, "prompt_tokens_details", "cached_tokens"))
        if cached is not None:
            result.cached_tokens = cached
    if timings := obj(chunk.get("timings")):
        result.timings = {str(k): v for k, v in timings.items()
                          if isinstance(v, int | float) and not isinstance(v, bool)}
    for choice in items(chunk.get("choices")):
        if result.first_choice_s is None:
            result.first_choice_s = time.perf_counter() - started
        piece = dig(choice, "delta", "content")
        if isinstance(piece, str) and piece:
            if result.ttft_s is None:
                result.ttft_s = time.perf_counter() - started
            result.chunks += 1
            pieces.append(piece)
        if not result.first_logprobs:
            result.first_logprobs = _top_logprobs(choice)


def _top_logprobs(choice: object) -> list[tuple[str, float]]:
    return list(top_logprobs(dig(choice, "logprobs", "content", 0)))


def top_logprobs(position: object) -> tuple[tuple[str, float], ...]:
    """One position's alternatives in an OpenAI `logprobs.content` item: (token, logprob)
    pairs, those without a numeric logprob left out."""
    pairs = ((str(dig(t, "token")), number(dig(t, "logprob")))
             for t in items(dig(position, "top_logprobs")))
    return tuple((token, lp) for token, lp in pairs if lp is not None)
