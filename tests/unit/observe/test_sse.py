"""The one reading of OpenAI streamed chunks (`observe/sse.py`), on the shapes the engines
send: vLLM's role chunk, its reasoning deltas (`delta.reasoning` since 0.11, as its
reasoning-outputs page documents; `reasoning_content` before it and in llama-server), the
completions endpoint's `text`, usage in a last chunk, kvlab's proxy's timeline comment."""

from __future__ import annotations

import json
from typing import Any

from kvlab.experiments.procedure import take_line
from kvlab.loadgen.record import RequestRecord, decode_events
from kvlab.observe import sse
from kvlab.records.pd import StreamCut


def data(obj: Any) -> str:
    return "data: " + json.dumps(obj)


def delta(**fields: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-kvlab-1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": fields, "logprobs": None,
                         "finish_reason": None}]}


# vLLM 0.32 with a reasoning parser: the role chunk, thinking, then the answer
REASONING_STREAM = [data(delta(role="assistant", content="")),
                    data(delta(reasoning="Let")), data(delta(reasoning=" me think")),
                    data(delta(content="Hello")), data(delta(content=" there")),
                    data({"id": "chatcmpl-kvlab-1", "choices": [], "usage": {
                        "prompt_tokens": 9, "completion_tokens": 4}}), "data: [DONE]"]


def read(lines: list[str]) -> sse.Stream:
    stream = sse.Stream(0.0)
    for n, line in enumerate(lines, 1):
        if (payload := sse.data_of(line)) is not None:
            stream.take(payload, float(n))
    return stream


def test_reasoning_and_answer_are_timed_apart() -> None:
    s = read(REASONING_STREAM)
    assert (s.ttft_s, s.reasoning_s, s.answer_s) == (2.0, 2.0, 4.0)
    assert s.chunks == 4 and "".join(s.text) == "Hello there"
    assert s.completion_tokens == 4 and s.done


def test_the_older_field_name_and_llama_servers_are_reasoning_too() -> None:
    s = read([data(delta(reasoning_content="hmm")), data(delta(content="ok"))])
    assert (s.ttft_s, s.reasoning_s, s.answer_s) == (1.0, 1.0, 2.0)


def test_a_model_that_does_not_reason_has_one_first_token() -> None:
    s = read([data(delta(role="assistant", content="")), data(delta(content="hi")),
              data({"choices": [{"index": 0, "text": " more"}]})])
    assert s.ttft_s == s.answer_s == 2.0 and s.reasoning_s is None and s.chunks == 2


def test_what_carries_no_token() -> None:
    for choice in ({"delta": {"role": "assistant"}}, {"delta": {"content": ""}},
                   {"delta": {}, "finish_reason": "stop"}, {"delta": {"content": None}},
                   {"text": ""}, "text", None, {"delta": "content"}):
        assert sse.carries(choice) == (False, False), choice
    assert sse.carries({"text": "a"}) == (True, False)
    assert sse.carries({"delta": {"reasoning": "r", "content": "c"}}) == (True, True)


def test_the_load_generator_stamps_the_same_tokens() -> None:
    record = RequestRecord(index=0, prompt_index=0, sent_ns=0, status=200)
    record.events = [(n, line.encode()) for n, line in enumerate(REASONING_STREAM, 1)]
    record.events.append((8, b': kvlab-timeline {"id":"r","prefill_ns":5,"handover_ns":1,'
                             b'"decode_ns":2,"proxy_ns":1}'))
    decode_events(record)
    assert record.ok and record.token_ns == [2, 3, 4, 5]
    assert (record.reasoning_ns, record.answer_ns) == (2, 4)
    assert record.response_id == "chatcmpl-kvlab-1"
    assert record.timeline == {"id": "r", "prefill_ns": 5, "handover_ns": 1, "decode_ns": 2,
                               "proxy_ns": 1}


def test_the_cancel_procedure_counts_the_same_tokens() -> None:
    cut = StreamCut()
    for line in REASONING_STREAM[:5]:
        take_line(line, cut, 0.0)
    assert cut.tokens == 4 and not cut.finished and cut.first_token_s is not None
    take_line("data: [DONE]", cut, 0.0)
    assert cut.finished


def test_a_timeline_comment_is_read_only_when_whole() -> None:
    assert sse.timeline_of(b': kvlab-timeline {"id": "x"}') == {"id": "x"}
    assert sse.timeline_of(b": kvlab-timeline {broken") is None
    assert sse.timeline_of(b": kvlab-timeline [1]") is None
    assert sse.timeline_of(b": ping") is None
