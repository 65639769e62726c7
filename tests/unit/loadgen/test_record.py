"""Raw events -> token stamps and usage, for the shapes vLLM and llama-server stream."""

from __future__ import annotations

import json
from typing import Any

from kvlab.loadgen.record import RequestRecord, decode_events


def event(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())


def record(*events: tuple[int, bytes], status: int = 200) -> RequestRecord:
    r = RequestRecord(index=0, prompt_index=0, sent_ns=1, end_ns=99, status=status)
    r.events = list(events)
    decode_events(r)
    return r


def test_vllm_chat_role_chunk_is_not_a_token_and_usage_counts() -> None:
    r = record(
        (10, event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})),
        (20, event({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})),
        (30, event({"choices": [{"index": 0, "delta": {"content": "lo there"}}]})),
        (31, event({"choices": [], "usage": {"prompt_tokens": 812, "completion_tokens": 3,
                                             "prompt_tokens_details": {"cached_tokens": 768}}})),
        (31, event(b"[DONE]")),
    )
    assert r.ok and r.token_ns == [20, 30] and r.chunks == 2
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (812, 3, 768)
    assert r.output_tokens == 3  # the server's count, not the two chunks
    assert r.done_marker and r.events == []
    assert b"Hel" in r.first_payload


def test_completions_text_and_llama_timings() -> None:
    r = record(
        (5, event({"choices": [{"index": 0, "text": " a"}]})),
        (7, event({"choices": [{"index": 0, "text": " b"}], "timings": {
            "cache_n": 120, "prompt_n": 8, "prompt_ms": 41.5}})),
    )
    assert r.token_ns == [5, 7] and r.cached_tokens == 120 and r.server_prompt_ms == 41.5
    assert r.completion_tokens is None and r.output_tokens == 2


def test_malformed_and_error_events_are_failures() -> None:
    bad = record((5, event({"choices": [{"text": "x"}]})), (6, event(b"{not json")))
    assert not bad.ok and bad.error == "malformed event" and "not json" in bad.error_detail
    err = record((5, event({"error": {"message": "engine died", "code": 500}})))
    assert not err.ok and err.error == "error event" and "engine died" in err.error_detail


def test_stream_without_output_is_a_failure() -> None:
    r = record((5, event({"choices": [], "usage": {"completion_tokens": 0}})),
               (6, event(b"[DONE]")))
    assert r.error == "no output" and r.failed


def test_tokens_that_decode_to_no_text_are_a_flagged_success() -> None:
    """Random weights can sample tokens whose text is empty: vLLM streams choices with "" and
    counts them in usage. vllm bench counts such a request (TTFT at its first choice-carrying
    event); kvlab did too little (a "no output" failure) until it did the same, flagged."""
    r = record((5, event({"choices": [{"index": 0, "text": ""}]})),
               (9, event({"choices": [{"index": 0, "text": ""}]})),
               (12, event({"choices": [], "usage": {"prompt_tokens": 40,
                                                    "completion_tokens": 16}})),
               (13, event(b"[DONE]")))
    assert r.ok and r.blank_output and r.error is None
    assert r.token_ns == [5, 9] and r.output_tokens == 16 and r.blank_ns == []
    # no usage tokens: nothing came back, whatever the choices said
    none = record((5, event({"choices": [{"index": 0, "text": ""}]})), (6, event(b"[DONE]")))
    assert none.error == "no output" and not none.blank_output


def test_error_status_is_not_decoded_as_a_stream() -> None:
    r = RequestRecord(index=0, prompt_index=0, status=500, error="http 500")
    r.events = [(1, event({"choices": [{"text": "x"}]}))]
    decode_events(r)
    assert r.token_ns == [] and r.error == "http 500" and r.events == []


def test_cancelled_is_not_failed() -> None:
    r = RequestRecord(index=0, prompt_index=0, status=200, cancelled=True)
    decode_events(r)
    assert r.cancelled and not r.failed and not r.ok and r.error is None


def test_the_proxys_failed_leg_is_kept() -> None:
    # before the response started: a JSON error naming the leg (kvlab proxy's shape)
    r = RequestRecord(index=0, prompt_index=0, sent_ns=1, end_ns=9, status=503,
                      error="http 503", error_detail=json.dumps({"error": {
                          "message": "the prefill leg failed", "code": 503, "leg": "prefill"}}))
    decode_events(r)
    assert r.failed and r.failed_leg == "prefill"
    # after it started: an SSE error event, then a clean end
    r = record(
        (10, event({"choices": [{"index": 0, "delta": {"content": "a"}}]})),
        (20, b"event: error\n" + event({"error": {"message": "mid-stream", "leg": "decode"}})),
    )
    assert r.error == "error event" and r.failed_leg == "decode"
    # an engine's own error names no leg; the proxy's "client" is not a leg
    plain = RequestRecord(index=0, prompt_index=0, status=400, error="http 400",
                          error_detail='{"error": {"message": "bad", "leg": "client"}}')
    decode_events(plain)
    assert plain.failed_leg is None
