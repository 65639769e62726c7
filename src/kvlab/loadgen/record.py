"""One request as it was measured: raw monotonic stamps, the server's usage, and its fate.

A record is filled in two steps. While the response streams, the client only stamps bytes
(`time.perf_counter_ns`, CLOCK_MONOTONIC on Linux) and keeps each server-sent event raw, so
the event loop does as little as possible between a byte arriving and its stamp. After the
level ends, `decode_events` turns the raw events into token stamps and the server's usage
counts. A failure or a cancellation is kept as data on the record, never dropped.

This module computes no statistic (see `stats`) and knows no engine: it reads the OpenAI
streaming shapes, with `observe/sse.py`'s definition of a token (answer and reasoning apart),
`usage`, the per-response cache fields both engines use
(`usage.prompt_tokens_details.cached_tokens`, and llama-server's `timings.cache_n`), the id
the server gave the answer, and kvlab's proxy's own words: which leg failed (`error.leg`, in
its error body before the stream starts and in its SSE `event: error` after) and, when asked,
the request's timeline through it (an SSE comment after the answer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from kvlab.core import JsonObject, integer
from kvlab.observe import carries, timeline_of


@dataclass(slots=True)
class RequestRecord:
    """One request. Times are `perf_counter_ns` stamps; 0 means "did not happen"."""

    index: int
    prompt_index: int
    scheduled_ns: int = 0  # when the schedule wanted it sent (lag = sent_ns - scheduled_ns)
    sent_ns: int = 0  # just before the request's bytes were handed to the socket
    headers_ns: int = 0  # the response's status line and headers had arrived
    end_ns: int = 0  # the response ended, failed or was cancelled
    status: int | None = None
    error: str | None = None  # failure kind, e.g. "http 500", "timeout", "connection closed"
    error_detail: str = ""
    cancelled: bool = False
    events: list[tuple[int, bytes]] = field(default_factory=list)  # (arrival ns, raw event)
    token_ns: list[int] = field(default_factory=list)  # arrival of each chunk carrying output
    chunks: int = 0  # server-sent events that carried output
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from the server's usage, not counted chunks
    cached_tokens: int | None = None
    server_prompt_ms: float | None = None  # llama-server's timings.prompt_ms: computing it
    done_marker: bool = False  # the stream ended with `data: [DONE]`
    first_payload: bytes = b""  # the first output-carrying event's JSON, for server stamps
    failed_leg: str | None = None  # through kvlab's proxy: "prefill" or "decode"
    request_id: str = ""  # the X-Request-Id sent (`client.request_id_of`)
    first_event_ns: int = 0  # arrival of the answer's first event, token or not
    answer_ns: int = 0  # arrival of the first answer token (`delta.content`, `text`)
    reasoning_ns: int = 0  # arrival of the first reasoning token
    response_id: str | None = None  # the `id` the server gave its answer
    timeline: JsonObject | None = None  # kvlab's proxy's, for this request
    blank_ns: list[int] = field(default_factory=list)  # choice-carrying events with no text
    blank_output: bool = False  # a success whose tokens decoded to no visible text

    @property
    def ok(self) -> bool:
        """A success: HTTP 200, no error, not cancelled, and at least one output chunk (or,
        flagged `blank_output`, usage tokens whose text was empty)."""
        return (self.status == 200 and self.error is None and not self.cancelled
                and bool(self.token_ns))

    @property
    def failed(self) -> bool:
        return not self.cancelled and not self.ok

    @property
    def output_tokens(self) -> int:
        """Output tokens: the server's usage count, or the chunk count when usage is absent."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return self.chunks


def _take_usage(record: RequestRecord, obj: dict[str, object]) -> None:
    """The server's counts, read as `observe.sse.Stream` reads them (a bool is no count)."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if (completion := integer(usage.get("completion_tokens"))) is not None:
            record.completion_tokens = completion
        if (prompt := integer(usage.get("prompt_tokens"))) is not None:
            record.prompt_tokens = prompt
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and (cached := integer(details.get("cached_tokens"))) \
                is not None:
            record.cached_tokens = cached
    timings = obj.get("timings")
    if isinstance(timings, dict) and (cache_n := integer(timings.get("cache_n"))) is not None:
        record.cached_tokens = cache_n
    if isinstance(timings, dict) and isinstance(ms := timings.get("prompt_ms"), int | float):
        record.server_prompt_ms = float(ms)


LEGS = ("prefill", "decode")


def leg_of(error: object) -> str | None:
    """The leg kvlab's proxy names in an error object (`{"leg": "decode", ...}`), if any."""
    leg = error.get("leg") if isinstance(error, dict) else None
    return leg if leg in LEGS else None


def _error_body_leg(detail: str) -> str | None:
    try:
        body = json.loads(detail)
    except (ValueError, RecursionError):
        return None
    return leg_of(body.get("error")) if isinstance(body, dict) else None


def _payloads(event: bytes) -> list[bytes]:
    return [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]


def reply_text(record: RequestRecord) -> str:
    """The answer's text from the raw events (before `decode_events` releases them): what a
    user session sends back as the assistant's turn."""
    parts: list[str] = []
    for _, event in record.events:
        for payload in _payloads(event):
            if payload == b"[DONE]":
                continue
            try:
                obj = json.loads(payload)
            except (ValueError, RecursionError):  # a hostile server nests past the parser
                continue
            for choice in (obj.get("choices") or []) if isinstance(obj, dict) else []:
                if isinstance(choice, dict):
                    delta = choice.get("delta") or {}
                    parts.append(str(choice.get("text") or delta.get("content") or ""))
    return "".join(parts)


def _take_tokens(record: RequestRecord, obj: dict[str, object], stamp: int,
                 payload: bytes) -> None:
    """Stamp an event that carries a token (answer or reasoning, `observe/sse.py`)."""
    choices = obj.get("choices")
    answer = reasoning = False
    for choice in choices if isinstance(choices, list) else ():
        a, r = carries(choice)
        answer, reasoning = answer or a, reasoning or r
    if not (answer or reasoning):
        if isinstance(choices, list) and choices and not record.token_ns:
            record.blank_ns.append(stamp)
        return
    if not record.token_ns:
        record.first_payload = payload
        rid = obj.get("id")
        record.response_id = rid[:200] if isinstance(rid, str) else None
    record.token_ns.append(stamp)
    record.chunks += 1
    if answer and not record.answer_ns:
        record.answer_ns = stamp
    if reasoning and not record.reasoning_ns:
        record.reasoning_ns = stamp


def decode_events(record: RequestRecord) -> None:
    """Fill token stamps, chunk count and usage from the raw events; a bad event is an error.

    Only a 200 response is decoded; an error body was kept in `error_detail` by the client.
    The raw events are released afterwards (they can be large across thousands of requests).
    """
    if record.status != 200 or not record.events:
        if record.status is not None and record.status != 200 and record.error_detail:
            record.failed_leg = _error_body_leg(record.error_detail)
        record.events = []
        return
    record.first_event_ns = record.events[0][0]
    for stamp, event in record.events:
        if event.startswith(b":"):  # a comment: the proxy's timeline, or a keep-alive
            record.timeline = timeline_of(event) or record.timeline
        for payload in _payloads(event):
            if payload == b"[DONE]":
                record.done_marker = True
                continue
            try:
                obj = json.loads(payload)
            except (ValueError, RecursionError):  # a hostile server nests past the parser
                record.error = record.error or "malformed event"
                shown = payload[:200].decode("utf-8", "replace")
                record.error_detail = record.error_detail or shown
                continue
            if not isinstance(obj, dict):
                continue
            if obj.get("error") is not None:
                record.error = record.error or "error event"
                record.error_detail = json.dumps(obj["error"])[:300]
                record.failed_leg = record.failed_leg or leg_of(obj["error"])
                continue
            _take_tokens(record, obj, stamp, payload)
            _take_usage(record, obj)
    record.events = []
    if record.error is None and not record.cancelled and not record.token_ns:
        _blank_or_no_output(record)
    record.blank_ns = []


def _blank_or_no_output(record: RequestRecord) -> None:
    """A stream without a visible token: a success when the server still streamed choices and
    counted output tokens in its usage (random weights can decode to nothing, and `vllm bench`
    counts these: its TTFT is the first choice-carrying event), flagged; else "no output"."""
    if record.blank_ns and (record.completion_tokens or 0) > 0:
        record.token_ns, record.chunks = list(record.blank_ns), len(record.blank_ns)
        record.blank_output = True
    else:
        record.error = "no output"
