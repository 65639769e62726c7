"""Odd server-sent chunks (`observe/chat.py`): a chunk that is not a JSON object, or whose
fields have other types, is skipped field by field, never a crash."""

from __future__ import annotations

import time

from kvlab.observe import chat


def absorb(*lines: str) -> chat.ChatResult:
    result = chat.ChatResult("u", None, 0.0, 0, "")
    pieces: list[str] = []
    for line in lines:
        chat._absorb(line, result, pieces, time.perf_counter())
    result.text = "".join(pieces)
    return result


def test_chunks_of_other_shapes_are_skipped() -> None:
    result = absorb('data: [1, 2]', 'data: "text"', 'data: {"choices": 3, "usage": [1]}',
                    'data: {"choices": [{"delta": {"content": 7}}], "timings": [0]}',
                    'data: {"usage": {"prompt_tokens": "12", "prompt_tokens_details": 5}}')
    assert result.text == "" and result.ttft_s is None
    assert result.prompt_tokens is None and result.cached_tokens is None


def test_a_well_formed_stream_still_reads() -> None:
    result = absorb('data: {"choices": [{"delta": {"content": "hi"}}]}',
                    'data: {"usage": {"prompt_tokens": 12, "completion_tokens": 1, '
                    '"prompt_tokens_details": {"cached_tokens": 8}}, "timings": '
                    '{"cache_n": 8, "prompt_n": 4}}', "data: [DONE]")
    assert result.text == "hi" and result.ttft_s is not None and result.chunks == 1
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (12, 1, 8)
    assert result.timings == {"cache_n": 8, "prompt_n": 4}
