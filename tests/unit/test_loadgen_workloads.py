"""Prompt sets: deterministic, shared where they should be, distinct where they should be."""

from __future__ import annotations

import pytest

from kvlab.core.errors import InputError
from kvlab.measure import workloads


def test_same_arguments_same_text() -> None:
    a = workloads.build("shared-prefix", 5, seed=3, preamble_tokens=200)
    b = workloads.build("shared-prefix", 5, seed=3, preamble_tokens=200)
    assert a == b
    assert workloads.build("shared-prefix", 1, seed=4, preamble_tokens=200) != a[:1]


def test_shared_prefix_shares_the_preamble_only() -> None:
    prompts = workloads.build("shared-prefix", 6, preamble_tokens=4096)
    systems = {p.messages[0][1] for p in prompts}
    questions = {p.messages[1][1] for p in prompts}
    assert len(systems) == 1 and len(questions) == 6
    words = len(next(iter(systems)).split())
    assert words == workloads.words_for(4096)  # about 4,096 tokens of a typical tokenizer
    # a later level asks different questions under the same preamble
    later = workloads.build("shared-prefix", 6, preamble_tokens=4096, start=6)
    assert later[0].messages[0] == prompts[0].messages[0]
    assert later[0].messages[1] not in {p.messages[1] for p in prompts}


def test_mixed_shares_nothing_but_a_short_system_line() -> None:
    prompts = workloads.build("mixed", 6, preamble_tokens=400)
    firsts = {p.messages[1][1][:200] for p in prompts}
    assert len(firsts) == 6
    assert {p.messages[0][1] for p in prompts} == {workloads.SYSTEM_LINE}


def test_multi_turn_grows_turn_by_turn() -> None:
    prompts = workloads.build("multi-turn", 8, preamble_tokens=100, turns=4)
    # 2 conversations: indices 0,1 are turn 1; 2,3 turn 2; ...
    assert [len(p.messages) for p in prompts] == [2, 2, 4, 4, 6, 6, 8, 8]
    first, third = prompts[0].as_messages(), prompts[2].as_messages()
    assert third[: len(first)] == first  # the history is resent exactly: a growing prefix
    assert prompts[0].as_text().endswith("assistant:")


def test_bad_set_is_refused() -> None:
    with pytest.raises(InputError, match="--prompt-set"):
        workloads.build("random", 3)
