"""Odd server-sent chunks, read by `observe/sse.py` (so by `observe/chat.py` and the cancel
procedure) and by the load generator's deferred reader (`loadgen/record.py`): a chunk that is
not a JSON object, whose fields have other types, or that is nested past the parser's depth
is skipped field by field, never a crash; and the two readers agree on every first token."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvlab.loadgen.record import RequestRecord, decode_events
from kvlab.observe import chat, sse
from kvlab.observe.sse import Stream


def absorb(*lines: str) -> chat.ChatResult:
    stream = Stream(0.0)
    for n, line in enumerate(lines, 1):
        if (payload := sse.data_of(line)) is not None:
            stream.take(payload, float(n))
    return chat.result_of("u", stream, float(len(lines) + 1))


def test_chunks_of_other_shapes_are_skipped() -> None:
    result = absorb('data: [1, 2]', 'data: "text"', 'data: {"choices": 3, "usage": [1]}',
                    'data: {"choices": [{"delta": {"content": 7}}], "timings": [0]}',
                    'data: {"usage": {"prompt_tokens": "12", "prompt_tokens_details": 5}}',
                    'data: {"choices": [{"delta": "hi", "text": ["x"]}, 4, null]}',
                    'data: {"choices": [{"delta": {"reasoning": 1, "content": null}}]}')
    assert result.text == "" and result.ttft_s is not None  # the first chunk with a choice
    assert result.ttft_from == "first chunk (no token)" and result.ttft_answer_s is None
    assert result.prompt_tokens is None and result.cached_tokens is None


def test_a_well_formed_stream_still_reads() -> None:
    result = absorb('data: {"choices": [{"delta": {"content": "hi"}}]}',
                    'data: {"usage": {"prompt_tokens": 12, "completion_tokens": 1, '
                    '"prompt_tokens_details": {"cached_tokens": 8}}, "timings": '
                    '{"cache_n": 8, "prompt_n": 4}}', "data: [DONE]")
    assert result.text == "hi" and result.ttft_s == 1.0 and result.chunks == 1
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (12, 1, 8)
    assert result.timings == {"cache_n": 8, "prompt_n": 4}


def test_nesting_past_the_parsers_depth_is_malformed_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert sse.chunk(deep).malformed
    record = RequestRecord(index=0, prompt_index=0, sent_ns=1, status=200)
    record.events = [(5, b"data: " + deep.encode())]
    decode_events(record)
    assert record.error == "malformed event" and not record.ok


# --- the two readers agree ------------------------------------------------------------
ODD = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=3),
                st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                      st.integers(), max_size=2))
DELTA = st.one_of(ODD, st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["assistant", ""]), "content": st.one_of(st.text(max_size=3), ODD),
    "reasoning": st.one_of(st.text(max_size=3), ODD),
    "reasoning_content": st.one_of(st.text(max_size=3), ODD)}))
CHOICE = st.one_of(ODD, st.fixed_dictionaries({}, optional={
    "delta": DELTA, "text": st.one_of(st.text(max_size=3), ODD),
    "finish_reason": st.one_of(st.none(), st.just("length"))}))
CHUNK = st.one_of(ODD, st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.text(max_size=8), ODD), "choices": st.one_of(st.lists(CHOICE,
                                                                             max_size=3), ODD),
    "usage": st.one_of(ODD, st.fixed_dictionaries({}, optional={
        "prompt_tokens": ODD, "completion_tokens": ODD,
        "prompt_tokens_details": st.one_of(ODD, st.fixed_dictionaries(
            {"cached_tokens": ODD}))}))}))


def payload_of(value: Any) -> bytes:
    return json.dumps(value).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CHUNK, min_size=1, max_size=6))
# found by hypothesis: a bool counted as output tokens by one reader only
@example(chunks=[{"id": None, "choices": [None], "usage": {"completion_tokens": True}}])
def test_the_deferred_and_the_incremental_reader_agree(chunks: list[Any]) -> None:
    """One definition of a token: the load generator's reader (bytes, after the level) and
    sse.Stream (text, as it arrives) find the same first token, first answer token, first
    reasoning token and token count, whatever the chunks' shapes."""
    stream = Stream(0.0)
    record = RequestRecord(index=0, prompt_index=0, sent_ns=0, status=200)
    for n, value in enumerate(chunks, 1):
        stream.take(json.dumps(value), float(n))
        record.events.append((n, b"data: " + payload_of(value)))
    decode_events(record)

    def first(ns: int) -> float | None:
        return float(ns) if ns else None

    assert stream.chunks == record.chunks
    assert stream.ttft_s == first(record.token_ns[0] if record.token_ns else 0)
    assert stream.answer_s == first(record.answer_ns)
    assert stream.reasoning_s == first(record.reasoning_ns)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64)))
def test_any_payload_reads_without_raising(payload: bytes | str) -> None:
    got = sse.chunk(payload)
    assert not (got.done and got.malformed)
    Stream(0.0).take(payload if isinstance(payload, str) else payload.decode("latin-1"), 1.0)
    raw = payload if isinstance(payload, bytes) else payload.encode()
    found = sse.timeline_of(b": kvlab-timeline " + raw)
    assert found is None or isinstance(found, dict)


def test_an_error_body_nested_past_the_parser_names_no_leg() -> None:
    record = RequestRecord(index=0, prompt_index=0, sent_ns=1, status=502,
                           error="http 502", error_detail="[" * 4096)
    decode_events(record)
    assert record.failed and record.failed_leg is None
