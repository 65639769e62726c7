"""The llama-server slot oracle on constructed streams: which slot a prompt gets, what it
reuses, and its bounds (property-based in
tests/adversarial/measure/test_oracle_properties.py)."""

from __future__ import annotations

import pytest

from kvlab.measure.slot_oracle import SlotCache, SlotRequest, common_prefix, replay, unbounded

PRE = list(range(100))  # a shared preamble


def one_at_a_time(*prompts: list[int]) -> list[SlotRequest]:
    return [SlotRequest(p, float(i), float(i) + 0.5) for i, p in enumerate(prompts)]


def test_one_slot_reuses_the_previous_prompts_prefix_to_the_token() -> None:
    got = replay(one_at_a_time([*PRE, 1, 2], [*PRE, 3, 4], [9] * 10), SlotCache(1))
    assert got == [0, 100, 0]


def test_a_prompt_entirely_cached_still_computes_one_token() -> None:
    assert replay(one_at_a_time(PRE, PRE), SlotCache(1)) == [0, 99]


def test_the_most_similar_idle_slot_is_chosen_above_the_threshold() -> None:
    a, b = PRE + [1] * 20, [7] * 120
    # two slots: a then b fill them; a's relative comes back to a's slot, not the LRU one
    got = replay(one_at_a_time(a, b, PRE + [2] * 20, [7] * 100 + [3] * 20), SlotCache(2))
    assert got == [0, 0, 100, 100]


def test_below_the_threshold_the_least_recently_used_slot_is_taken() -> None:
    a, b = PRE + [1] * 100, [7] * 200
    # shares 100 / 200 = 0.5 with a's slot: not above 0.5, so the LRU slot (a's) is taken anyway
    assert replay(one_at_a_time(a, b, PRE + [2] * 100), SlotCache(2)) == [0, 0, 100]
    # with b the least recently used, a prompt too unlike a lands on b's slot and reuses nothing
    assert replay(one_at_a_time(b, a, PRE + [2] * 100), SlotCache(2)) == [0, 0, 0]
    assert replay(one_at_a_time(b, a, PRE + [2] * 100), SlotCache(2, similarity=0.4)) == \
        [0, 0, 100]


def test_a_busy_slot_is_not_chosen_and_a_full_house_waits_for_the_first_free() -> None:
    long = SlotRequest([*PRE, 1], 0.0, 10.0)  # holds slot 0 until 10 s
    got = replay([long, SlotRequest([5] * 50, 1.0, 2.0), SlotRequest([*PRE, 2], 3.0, 4.0)],
                 SlotCache(2))
    assert got == [0, 0, 0]  # its relative's slot is busy: it gets the other
    waits = replay([SlotRequest([*PRE, 1], 0.0, 5.0), SlotRequest([*PRE, 2], 1.0, 6.0)],
                   SlotCache(1))
    assert waits == [0, 100]


def test_the_unbounded_bound_holds_every_earlier_prompt() -> None:
    stream = one_at_a_time([*PRE, 1], [8] * 50, [9] * 50, [*PRE, 2])
    assert replay(stream, SlotCache(1)) == [0, 0, 0, 0]
    assert unbounded(stream) == [0, 0, 0, 100]
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2


def test_no_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        SlotCache(0)
