"""What a level of user sessions' turns say, read back after it ran: pure functions.

A returning turn is a turn >= 1 whose previous turn succeeded. It came back after its KV was
evicted when its cached tokens fell at least one cache block below the previous turn's prompt
tokens (a paged cache serves whole blocks, so a conversation held whole loses less than one).
The block is given (the engine adapter's), or read from the cached counts themselves. The
working set is the peak, over the level, of the live conversations' contexts: what the cache
had to hold to lose none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.workloads import Prompt
from kvlab.records import SessionsEvidence


def cache_block(cached: Sequence[int], given: int | None) -> tuple[int, str]:
    """The cache block the eviction rule uses, and where it came from: given, else the
    greatest common divisor of the nonzero cached-token counts (a paged cache hands out
    whole blocks), else 1."""
    if given:
        return given, "given"
    found = 0
    for n in cached:
        if n > 0:
            found = math.gcd(found, n)
    if found:
        return found, "inferred: the greatest common divisor of the cached-token counts"
    return 1, "no cached tokens were reported: one token"


def _conversations(records: Sequence[RequestRecord],
                   prompts: dict[int, Prompt]) -> dict[int, list[tuple[int, RequestRecord]]]:
    out: dict[int, list[tuple[int, RequestRecord]]] = {}
    for r in records:
        p = prompts.get(r.prompt_index)
        if p is not None and p.conversation is not None and p.turn is not None:
            out.setdefault(p.conversation, []).append((p.turn, r))
    return {c: sorted(turns, key=lambda x: x[0]) for c, turns in out.items()}


def working_set(by_conv: dict[int, list[tuple[int, RequestRecord]]]) -> int:
    """The peak, over the level, of the live conversations' contexts (prompt plus answer of
    each one's latest finished turn), in tokens: what the cache had to hold to lose none."""
    events: list[tuple[int, int, int]] = []  # (time, conversation, context; -1 = it ended)
    for conv, turns in by_conv.items():
        ok = [r for _, r in turns if r.ok and r.prompt_tokens is not None]
        for r in ok:
            events.append((r.end_ns, conv, (r.prompt_tokens or 0) + r.output_tokens))
        if ok:
            events.append((ok[-1].end_ns + 1, conv, -1))
    live: dict[int, int] = {}
    total = peak = 0
    for _, conv, context in sorted(events):
        total -= live.pop(conv, 0)
        if context >= 0:
            live[conv] = context
            total += context
        peak = max(peak, total)
    return peak


def summary(records: Sequence[RequestRecord], prompts: dict[int, Prompt],
            block_given: int | None = None) -> SessionsEvidence:
    """What the turns say: returning turns, how many came back after eviction, cached tokens
    on first and returning turns, the working set (see the module docstring)."""
    by_conv = _conversations(records, prompts)
    block, block_from = cache_block([r.cached_tokens or 0 for r in records], block_given)
    first, returning, evicted = [], [], 0
    for turns in by_conv.values():
        previous: RequestRecord | None = None
        for turn, r in turns:
            if turn == 0 and r.ok:
                first.append(r)
            elif (r.ok and previous is not None and previous.ok and r.cached_tokens is not None
                    and previous.prompt_tokens is not None):
                returning.append(r)
                evicted += r.cached_tokens + block <= previous.prompt_tokens
            previous = r
    prompt = sum(r.prompt_tokens or 0 for r in returning)
    cached = sum(r.cached_tokens or 0 for r in returning)
    return SessionsEvidence(
        conversations=len(by_conv), turns=sum(len(t) for t in by_conv.values()),
        returning_turns=len(returning), evicted_turns=evicted,
        held_turns=len(returning) - evicted,
        returning_hit_rate=round(cached / prompt, 4) if prompt else None,
        returning_cached_tokens_mean=round(cached / len(returning), 1) if returning else None,
        first_turn_cached_tokens_mean=round(
            sum(r.cached_tokens or 0 for r in first) / len(first), 1) if first else None,
        working_set_tokens=working_set(by_conv), cache_block_tokens=block,
        cache_block_from=block_from,
        eviction_rule="a returning turn whose cached tokens fell at least one cache block "
                      "below the previous turn's prompt tokens came back after eviction")
