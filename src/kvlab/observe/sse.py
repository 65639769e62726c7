"""OpenAI-compatible server-sent events, read one way for every kvlab reader.

What a chunk carries (`chunk`), and a stream's first tokens (`Stream`), for each reader that
parses as the answer arrives: the single-request client (`observe/chat.py`, so `kvlab demo`,
the reuse measurements and llama-server's client) and the cancel procedure
(`experiments/procedure.py`). The load generator keeps its own loop (it stamps byte blocks
while the level runs and parses after it, `loadgen/record.py`) but asks this module what a
choice carries (`carries`), so there is one definition of a token:

- An **answer token** is a choice's non-empty `text` (completions) or `delta.content` (chat).
- A **reasoning token** is a choice's non-empty `delta.reasoning` (vLLM since 0.11) or
  `delta.reasoning_content` (vLLM before it, llama-server, DeepSeek's API).
- A role-only delta, an empty string, a usage-only or a finish-only chunk carries no token.

and one definition of the first token's time:

    TTFT        = t(first event carrying a token of either kind) - t(request sent)
    TTFT answer = t(first event carrying an answer token) - t(request sent)
    TTFT reasoning = t(first event carrying a reasoning token) - t(request sent)

For a model that does not reason the three are one (TTFT reasoning is absent); for one that
does, TTFT is its first reasoning token and TTFT answer comes after the thinking. The stamps
are the client's monotonic clock (`time.perf_counter[_ns]`) when the event's bytes arrived.

It also reads kvlab's proxy's per-request timeline, which the proxy appends to a stream as an
SSE comment when asked (`proxy/app.py`): comments are ignored by every SSE reader, so the
answer is unchanged for any other client.

It knows no HTTP and no engine; odd shapes (a chunk that is not an object, fields of other
types) carry nothing rather than raise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from kvlab.core import JsonObject, dig, integer, items, obj

DONE = "[DONE]"
ANSWER_KEYS = ("content",)
REASONING_KEYS = ("reasoning", "reasoning_content")
TIMELINE_PREFIX = b": kvlab-timeline "  # the proxy's comment line, then a JSON object


def carries(choice: object) -> tuple[bool, bool]:
    """(answer token, reasoning token): what one choice of a chunk carries."""
    if not isinstance(choice, dict):
        return False, False
    text = choice.get("text")
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return isinstance(text, str) and bool(text), False
    answer = _nonempty(delta, ANSWER_KEYS) or (isinstance(text, str) and bool(text))
    return answer, _nonempty(delta, REASONING_KEYS)


def _nonempty(delta: JsonObject, keys: tuple[str, ...]) -> bool:
    return any(isinstance(v, str) and v for v in (delta.get(k) for k in keys))


def data_of(line: str) -> str | None:
    """The payload of one SSE `data:` line, stripped; None for any other line."""
    return line[5:].strip() if line.startswith("data:") else None


@dataclass
class Chunk:
    """What one `data:` payload carries."""

    done: bool = False  # the `[DONE]` marker
    malformed: bool = False  # not JSON at all
    error: object = None  # an error object (kvlab's proxy names the failed `leg`)
    choices: int = 0
    answer: str = ""
    reasoning: str = ""
    finished: bool = False  # a choice gave a finish_reason
    usage: JsonObject = field(default_factory=dict)
    timings: JsonObject = field(default_factory=dict)  # llama-server's
    position: object = None  # the first `logprobs.content` item any choice carries

    @property
    def answered(self) -> bool:
        return bool(self.answer)

    @property
    def reasoned(self) -> bool:
        return bool(self.reasoning)


def chunk(payload: str | bytes) -> Chunk:
    """Read one payload; never raises on odd input."""
    if payload in (DONE, DONE.encode()):
        return Chunk(done=True)
    try:
        raw = json.loads(payload)
    except (ValueError, RecursionError):
        return Chunk(malformed=True)
    doc = obj(raw)
    out = Chunk(error=doc.get("error"), usage=obj(doc.get("usage")),
                timings=obj(doc.get("timings")))
    for choice in items(doc.get("choices")):
        out.choices += 1
        if out.position is None:
            out.position = dig(choice, "logprobs", "content", 0)
        out.answer += _text(choice, "text") + _text(dig(choice, "delta"), *ANSWER_KEYS)
        out.reasoning += _text(dig(choice, "delta"), *REASONING_KEYS)
        out.finished = out.finished or bool(dig(choice, "finish_reason"))
    return out


def _text(value: object, *keys: str) -> str:
    for key in keys:
        found = dig(value, key)
        if isinstance(found, str) and found:
            return found
    return ""


@dataclass
class Stream:
    """A stream read chunk by chunk: its first tokens' times (seconds from `started`), its
    text, the server's usage, and how it ended. `take(payload, now)` per `data:` payload."""

    started: float
    ttft_s: float | None = None
    answer_s: float | None = None
    reasoning_s: float | None = None
    first_choice_s: float | None = None
    chunks: int = 0  # events carrying a token of either kind
    text: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, float] | None = None
    first_position: object = None  # the first token's logprobs, where asked for
    done: bool = False
    finished: bool = False
    error: object = None

    def take(self, payload: str, now: float) -> Chunk:
        """Count one payload that arrived at `now` (the same clock as `started`)."""
        got = chunk(payload)
        self.done = self.done or got.done
        self.finished = self.finished or got.finished or got.done
        if got.error is not None:
            self.error = got.error
        since = now - self.started
        if got.choices and self.first_choice_s is None:
            self.first_choice_s = since
        if self.first_position is None:
            self.first_position = got.position
        if got.answered or got.reasoned:
            self.chunks += 1
            self.ttft_s = since if self.ttft_s is None else self.ttft_s
        if got.answered:
            self.text.append(got.answer)
            self.answer_s = since if self.answer_s is None else self.answer_s
        if got.reasoned and self.reasoning_s is None:
            self.reasoning_s = since
        self._usage(got)
        return got

    def _usage(self, got: Chunk) -> None:
        if got.usage:
            self.prompt_tokens = integer(got.usage.get("prompt_tokens"))
            self.completion_tokens = integer(got.usage.get("completion_tokens"))
            cached = integer(dig(got.usage, "prompt_tokens_details", "cached_tokens"))
            if cached is not None:
                self.cached_tokens = cached
        if got.timings:
            self.timings = {str(k): v for k, v in got.timings.items()
                            if isinstance(v, int | float) and not isinstance(v, bool)}


def timeline_of(event: bytes) -> JsonObject | None:
    """The proxy's timeline in one raw SSE event (its comment line), or None."""
    for line in event.split(b"\n"):
        if line.startswith(TIMELINE_PREFIX):
            try:
                found = json.loads(line[len(TIMELINE_PREFIX):])
            except (ValueError, RecursionError):
                return None
            return found if isinstance(found, dict) else None
    return None
