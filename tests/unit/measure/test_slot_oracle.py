"""The llama-server slot oracle on constructed streams: which slot a prompt gets, what it
reuses, and its bounds (property-based in
tests/adversarial/measure/test_oracle_properties.py)."""

from __future__ import annotations

import pytest

from kvlab.measure.slot_oracle import (
    RamCache,
    SlotCache,
    SlotRequest,
    common_prefix,
    replay,
    unbounded,
)

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


def ram(limit_tokens: int = 0, **kw: bool) -> RamCache:
    """A RAM cache of one byte a token: `limit_tokens` tokens (0: no byte limit)."""
    return RamCache(limit_bytes=limit_tokens, bytes_per_token=1.0, limit_tokens=100_000, **kw)


P, Q, R = PRE + [1] * 100, [7] * 200, [8] * 200


def test_a_prompt_whose_slot_another_took_comes_back_from_the_ram_cache() -> None:
    # the lab notes' test: P, Q, P on one slot; 1937 of 1938 cached with it, 19 without
    assert replay(one_at_a_time(P, Q, P), SlotCache(1)) == [0, 0, 0]
    assert replay(one_at_a_time(P, Q, P), SlotCache(1), ram()) == [0, 0, 199]


def test_a_prompt_larger_than_the_whole_ram_cache_is_never_saved() -> None:
    assert replay(one_at_a_time(P, Q, P), SlotCache(1), ram(limit_tokens=150)) == [0, 0, 0]


def test_the_oldest_saved_prompt_goes_to_make_room() -> None:
    # room for two prompts: P and Q saved as Q and R take the slot; when P returns, R is
    # saved first and P, the oldest, goes to make room: the server saves before it loads
    assert replay(one_at_a_time(P, Q, R, P), SlotCache(1), ram(limit_tokens=450)) == \
        [0, 0, 0, 0]
    assert replay(one_at_a_time(P, Q, R, Q), SlotCache(1), ram(limit_tokens=450)) == \
        [0, 0, 0, 199]
    assert replay(one_at_a_time(P, Q, R, P), SlotCache(1), ram(limit_tokens=650)) == \
        [0, 0, 0, 199]


def test_a_saved_prompt_keeping_under_a_quarter_of_itself_is_not_loaded() -> None:
    long = [*PRE, *([1] * 400)]  # 500 tokens; a prompt sharing its first 100 keeps 0.2
    assert replay(one_at_a_time(long, Q, [*PRE, 5]), SlotCache(1), ram()) == [0, 0, 0]
    near = [*PRE, *([1] * 200)]  # 300 tokens: 100 kept is a third
    assert replay(one_at_a_time(near, Q, [*PRE, 5]), SlotCache(1), ram()) == [0, 0, 100]


def test_a_slot_kept_by_similarity_is_not_saved_first() -> None:
    # X's relative Y keeps 3/4 of X in X's slot: X is not saved; Q then takes the slot (Y
    # saved), and X comes back to Y's 150 shared tokens, not to itself
    shared = list(range(150))
    x, y = [*shared, *([1] * 50)], [*shared, *([2] * 50)]
    assert replay(one_at_a_time(x, y, Q, x), SlotCache(1), ram()) == [0, 150, 0, 150]
    # kept under half: the slot is saved before Y takes it, and X comes back whole
    x = [*shared[:60], *([1] * 140)]
    y = [*shared[:60], *([2] * 40)]  # shares 60 / 100 of itself, 60 / 200 of X
    assert replay(one_at_a_time(x, y, Q, x), SlotCache(1), ram()) == [0, 60, 0, 199]


def test_idle_slots_are_saved_and_a_unified_cache_clears_them() -> None:
    # two slots: X, then Q beside it (X's idle slot saved), then X's relative Y keeps 3/4 of
    # X in its slot (nothing saved), then X extended comes back on the LRU slot
    shared = list(range(150))
    x, y = [*shared, *([1] * 50)], [*shared, *([2] * 50)]
    stream = one_at_a_time(x, Q, y, [*x, *([1] * 200)])
    # saved only when a slot is taken: X was never saved, Y's slot is not the LRU one
    assert replay(stream, SlotCache(2), ram(save_idle=False)) == [0, 0, 150, 0]
    # idle slots saved as each request starts: X is in RAM and moves into the LRU slot
    assert replay(stream, SlotCache(2), ram(save_idle=True)) == [0, 0, 150, 200]
    # unified: X's slot was cleared once saved, so Y loaded X from RAM (taking it out), and
    # nothing holds X when it comes back
    assert replay(stream, SlotCache(2), ram(save_idle=True, unified=True)) == [0, 0, 150, 0]


def test_a_slot_holds_its_generated_tokens_which_count_but_never_match() -> None:
    served = replay([SlotRequest(P, 0.0, 0.5, generated=3), SlotRequest([*P, 9], 1.0, 1.5)],
                    SlotCache(1))
    assert served == [0, 200]
    # room for 450 tokens: P and Q saved with 30 generated each pass it, so P goes first
    def stream(generated: int) -> list[SlotRequest]:
        return [SlotRequest(p, float(i), i + 0.5, generated) for i, p in enumerate((P, Q, R, P))]
    tight = RamCache(limit_bytes=0, bytes_per_token=1.0, limit_tokens=450)
    assert replay(stream(0), SlotCache(1), tight) == [0, 0, 0, 199]
    assert replay(stream(30), SlotCache(1), tight) == [0, 0, 0, 0]


def test_a_ram_cache_refuses_a_negative_size() -> None:
    with pytest.raises(ValueError, match="positive size per token"):
        RamCache(limit_bytes=-1, bytes_per_token=1.0, limit_tokens=0)
