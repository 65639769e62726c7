"""Prompt sets: deterministic, shared where they should be, distinct where they should be."""

from __future__ import annotations

import pytest

from kvlab.core.errors import InputError
from kvlab.loadgen import workloads
from kvlab.records.workload import PrefixGroups, PromptSizing


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


def test_disjoint_ranges_share_no_conversation() -> None:
    level = workloads.build("multi-turn", 8, preamble_tokens=50, turns=4, start=0)
    warmup = workloads.build("multi-turn", 8, preamble_tokens=50, turns=4, start=500_000)
    assert {p.conversation for p in level} == {0, 1}
    assert {p.conversation for p in warmup} == {500_000, 500_001}
    assert [p.turn for p in warmup] == [0, 0, 1, 1, 2, 2, 3, 3]
    openings = {p.messages[1][1] for p in level}
    assert openings.isdisjoint(p.messages[1][1] for p in warmup)
    assert all(p.document_tokens == 50 for p in level)


def test_a_range_past_one_round_starts_new_conversations() -> None:
    prompts = workloads.build("multi-turn", 12, preamble_tokens=50, turns=4, conversations=2)
    assert [p.conversation for p in prompts] == [0, 1] * 4 + [2, 3, 2, 3]
    assert [p.turn for p in prompts[8:]] == [0, 0, 1, 1]
    # one prompt built alone at its place in the range is the same prompt
    alone = workloads.build("multi-turn", 1, preamble_tokens=50, turns=4, conversations=2,
                            offset=9)
    assert alone == [prompts[9]]


def test_calibration_fits_the_preamble_with_the_models_tokenizer() -> None:
    def count(text: str) -> int:  # 2 tokens a word and 1 per sentence: not the estimate
        return 2 * len(text.split()) + text.count(".")

    sizing = workloads.size_with(count, 3, 1000, "a local tokenizer")
    assert sizing is not None and sizing.method == "tokenizer"
    assert sizing.tokens_per_word == pytest.approx(2.08, abs=0.03)
    actual = count(workloads.preamble(3, 1000, sizing))
    assert sizing.as_record(3, 1000) == PromptSizing(
        method="tokenizer", source="a local tokenizer",
        tokens_per_word=round(sizing.tokens_per_word, 4),
        preamble_tokens_requested=1000, preamble_tokens_actual=actual)
    assert 997 <= actual <= 1000  # a word costs 2 or 3 tokens: the closest at or below
    # other documents go by the measured tokens per word
    assert sizing.words(1000) == pytest.approx(1000 / sizing.tokens_per_word, abs=1)
    # a tokenizer that cannot answer: no sizing, the caller keeps the estimate
    assert workloads.size_with(lambda text: None, 3, 1000, "x") is None


def test_best_fit_prefers_the_closest_count_not_above() -> None:
    assert workloads.best_fit({10: 98, 11: 101, 12: 103}, 100) == 10
    assert workloads.best_fit({10: 102, 11: 101}, 100) == 11  # all above: the smallest


def test_prefix_groups_split_the_requests_by_their_shares() -> None:
    shares = workloads.check_shares(3, (2, 1, 1))
    assert shares == (0.5, 0.25, 0.25)
    prompts = workloads.build("shared-prefix", 400, seed=5, preamble_tokens=300, shares=shares)
    by_group: dict[int, set[str]] = {}
    for p in prompts:
        assert p.group is not None
        by_group.setdefault(p.group, set()).add(p.messages[0][1])
    assert sorted(by_group) == [0, 1, 2]
    assert all(len(texts) == 1 for texts in by_group.values())  # one preamble per group
    assert len({next(iter(t)) for t in by_group.values()}) == 3  # and three different ones
    counts = [sum(p.group == g for p in prompts) for g in range(3)]
    assert 160 <= counts[0] <= 240 and all(70 <= c <= 130 for c in counts[1:])
    # group 0's preamble is the one-group set's; the same index picks the same group again
    assert by_group[0] == {workloads.build("shared-prefix", 1, seed=5,
                                           preamble_tokens=300)[0].messages[0][1]}
    again = workloads.build("shared-prefix", 400, seed=5, preamble_tokens=300, shares=shares)
    assert [p.group for p in again] == [p.group for p in prompts]
    assert workloads.prefix_groups("shared-prefix", shares) == PrefixGroups(
        groups=3, shares=[0.5, 0.25, 0.25])


@pytest.mark.parametrize(("groups", "shares"), [(0, ()), (2, (1.0,)), (2, (1.0, 0.0))])
def test_bad_prefix_groups_are_refused(groups: int, shares: tuple[float, ...]) -> None:
    with pytest.raises(InputError, match=r"--prefix-groups|--group-shares"):
        workloads.check_shares(groups, shares)


def test_session_turn_carries_the_real_history() -> None:
    first = workloads.session_turn(7, seed=1, conversation=3, turn=0, history=(), tokens=80)
    assert [r for r, _ in first.messages] == ["system", "user"]
    assert (first.conversation, first.turn, first.document_tokens) == (3, 0, 80)
    history = (first.messages[-1], ("assistant", "a reply the server really sent"))
    second = workloads.session_turn(8, seed=1, conversation=3, turn=1, history=history,
                                    tokens=80)
    assert second.messages[:3] == (first.messages[0], *history)
    assert second.messages[-1][0] == "user" and second.messages[-1] != first.messages[-1]
    # the same conversation's opening and questions as the multi-turn set
    multi = workloads.build("multi-turn", 2, seed=1, preamble_tokens=80, turns=2, start=3,
                            conversations=1)
    assert first.messages == multi[0].messages and second.messages[-1] == multi[1].messages[-1]
    with pytest.raises(ValueError, match="history"):
        workloads.session_turn(9, seed=1, conversation=3, turn=2, history=history, tokens=80)


def test_a_distinct_opening_puts_a_tag_of_its_own_conversation_first() -> None:
    """The shared-first-block control: every conversation's system line begins with its own
    tag, so no two conversations share the first block (the tag comes before anything else a
    template adds after its role marker); turns of one conversation keep the same tag."""
    shared = [workloads.session_turn(k, seed=1, conversation=k, turn=0, history=(), tokens=40)
              for k in range(3)]
    tagged = [workloads.session_turn(k, seed=1, conversation=k, turn=0, history=(), tokens=40,
                                     distinct_opening=True) for k in range(3)]
    assert len({p.messages[0] for p in shared}) == 1
    systems = [p.messages[0][1] for p in tagged]
    assert len(set(systems)) == 3
    assert all(s.endswith(workloads.SYSTEM_LINE) and not s.startswith(workloads.SYSTEM_LINE)
               for s in systems)
    # the tags differ in their first characters, not only somewhere later
    assert len({s[:12] for s in systems}) == 3
    history = (tagged[1].messages[-1], ("assistant", "ok"))
    later = workloads.session_turn(9, seed=1, conversation=1, turn=1, history=history,
                                   tokens=40, distinct_opening=True)
    assert later.messages[0] == tagged[1].messages[0]
    # the documents and questions are the shared run's own: one variable changed
    assert [p.messages[1:] for p in tagged] == [p.messages[1:] for p in shared]
