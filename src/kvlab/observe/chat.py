"""One streamed chat request, timed, with the server's own reuse evidence.

TTFT is timed with `time.perf_counter` from just before the request is sent, as
`observe/sse.py` defines it once for kvlab: to the first chunk carrying a token, answer or
reasoning; the first answer token and the first reasoning token are kept apart
(`ttft_answer_s`, `ttft_reasoning_s`). When the first token ends the answer (random weights
sometimes emit end-of-text at once) there is no token: TTFT then falls back to the first
chunk that carries a choice, flagged in `ttft_from`. The last chunk's `usage`
(`stream_options.include_usage`) gives prompt, completion and cached tokens
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

from kvlab.core import (
    EngineError,
    JsonObject,
    UnreachableError,
    api_base,
    dig,
    items,
    number,
)
from kvlab.observe.sse import Stream, data_of
from kvlab.records import ChatTiming


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
    ttft_from: str = "first token"
    ttft_answer_s: float | None = None
    ttft_reasoning_s: float | None = None

    @property
    def reused_tokens(self) -> int | None:
        """Prompt tokens the server says it did not compute (llama: cache_n)."""
        if self.timings and "cache_n" in self.timings:
            return int(self.timings["cache_n"])
        return self.cached_tokens

    def timing(self) -> ChatTiming:
        """The answer as a notebook row states it (seconds rounded to 0.1 ms)."""
        return ChatTiming(endpoint=self.endpoint, ttft_s=_rounded(self.ttft_s),
                          total_s=round(self.total_s, 4), chunks=self.chunks,
                          prompt_tokens=self.prompt_tokens,
                          completion_tokens=self.completion_tokens,
                          cached_tokens=self.cached_tokens, timings=self.timings,
                          ttft_from=None if self.ttft_from == "first token" else self.ttft_from,
                          ttft_answer_s=_rounded(self.ttft_answer_s),
                          ttft_reasoning_s=_rounded(self.ttft_reasoning_s))


def _rounded(seconds: float | None) -> float | None:
    return round(seconds, 4) if seconds is not None else None


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
    stream = Stream(started)
    try:
        async with client.stream("POST", endpoint + "/chat/completions", json=body,
                                 headers=headers) as response:
            if response.status_code >= 400:
                detail = error_message((await response.aread()).decode("utf-8", "replace"))
                raise EngineError(f"{endpoint} answered HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if (payload := data_of(line)) is not None:
                    stream.take(payload, time.perf_counter())
    except httpx.TimeoutException:
        raise UnreachableError(f"{endpoint} did not answer within the timeout") from None
    except httpx.HTTPError as exc:
        raise UnreachableError(f"{endpoint} did not answer: {exc}") from None
    unfinished(endpoint, stream)
    return result_of(endpoint, stream, time.perf_counter() - started)


def unfinished(endpoint: str, stream: Stream) -> None:
    """EngineError for a stream that is no answer: an error event in it (vLLM's engine core
    gone), or an end with no finish_reason and no [DONE] (the engine stopped mid-request).
    Either is a failure with its cause, never a timing or a verdict."""
    if stream.error is not None:
        detail = error_message(json.dumps({"error": stream.error}))
        raise EngineError(f"{endpoint} failed mid-stream after {stream.chunks} tokens: {detail}")
    if not stream.finished:
        raise EngineError(f"{endpoint} ended the stream after {stream.chunks} tokens with no "
                          "finish_reason and no [DONE]: the engine stopped mid-request")


def result_of(endpoint: str, stream: Stream, total_s: float) -> ChatResult:
    """What a read stream showed, as a ChatResult."""
    result = ChatResult(endpoint=endpoint, ttft_s=stream.ttft_s, total_s=total_s,
                        chunks=stream.chunks, text="".join(stream.text),
                        prompt_tokens=stream.prompt_tokens,
                        completion_tokens=stream.completion_tokens,
                        cached_tokens=stream.cached_tokens, timings=stream.timings,
                        first_logprobs=list(top_logprobs(stream.first_position)),
                        first_choice_s=stream.first_choice_s,
                        ttft_answer_s=stream.answer_s, ttft_reasoning_s=stream.reasoning_s)
    if result.ttft_s is None and result.first_choice_s is not None:
        result.ttft_s, result.ttft_from = result.first_choice_s, "first chunk (no token)"
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


def top_logprobs(position: object) -> tuple[tuple[str, float], ...]:
    """One position's alternatives in an OpenAI `logprobs.content` item: (token, logprob)
    pairs, those without a numeric logprob left out."""
    pairs = ((str(dig(t, "token")), number(dig(t, "logprob")))
             for t in items(dig(position, "top_logprobs")))
    return tuple((token, lp) for token, lp in pairs if lp is not None)


# two answers agree when their first token's top logprobs differ by at most this
LOGPROB_TOLERANCE = 1e-3


def logprob_gap(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> float | None:
    """Largest |difference| between two top-logprob lists over the tokens both list.

    None when either list is empty or they share no token (not comparable at all).
    """
    left, right = dict(a), dict(b)
    common = set(left) & set(right)
    if not common:
        return None
    return max(abs(left[t] - right[t]) for t in common)
