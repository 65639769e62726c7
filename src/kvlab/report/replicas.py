"""The replicas row: each arm's figures, and the lab's answer for a user with N replicas.

Read from `replicas` lines alone (`records/replicas.py`). The answer, per prompt set: of the
arms with no failed request that used the replicas (the busiest took at most `EVEN` times the
mean: an arm that sends everything to one replica measures one replica, and on a machine
whose replicas share its cores that can look as fast as three), those whose TTFT median is not
measurably slower than the fastest's (their 95% intervals overlap), and of them the one whose
replicas hit the most of the prompt in their caches. Reuse decides only where latency cannot
tell the arms apart, so an arm that hits more but queues on one replica does not win. When no
arm used the replicas evenly enough, all that ran without failures are ranked, and the answer
says so.

The P/D lab's decision "which router" (`router`) is the same answer across the prompt sets,
with each arm's hit share and TTFT median as its chart; the table marks the chosen arm of each
prompt set and keeps the answer in its evidence.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.records import REPLICAS, Notebook, ReplicasRecord
from kvlab.report.common import Line, Table, missing
from kvlab.report.decisions_common import (
    NOT_ENOUGH,
    Decision,
    Mark,
    Panel,
    _absent,
    _undecided,
)

ROUTER_Q = "Which router would you put in front of your replicas?"
CHOSEN = "the lab's choice"  # the verdict of each prompt set's chosen arm

EVEN = 1.5  # the busiest replica's requests over the mean, at most, to count as using N
COLUMNS = ("arm", "router", "hit rate", "oracle (its assignment)", "oracle (ideal)",
           "TTFT p50 [95%]", "TTFT p99 [95%]", "busiest / mean", "requests per replica",
           "failed", "router's own time", "the plan's prediction")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f}"


def _interval(point: float | None, low: float | None, high: float | None) -> str:
    if point is None:
        return "-"
    bounds = f" [{_ms(low)}, {_ms(high)}]" if low is not None and high is not None else ""
    return f"{_ms(point)} ms{bounds}"


def _p50(r: ReplicasRecord) -> str:
    return _interval(r.ttft_s.p50 if r.ttft_s else None, r.ttft_p50_low_s, r.ttft_p50_high_s)


def cells(r: ReplicasRecord) -> list[str]:
    """One arm's row of the table, in `COLUMNS` order."""
    ttft = r.ttft_s
    per = ", ".join(f"{c.requests:.0f}" if c.requests is not None else "?" for c in r.replicas)
    added = f"{1e6 * r.router_added_s:.0f} us" if r.router_added_s is not None else "-"
    return [r.arm, r.router, _pct(r.hit_rate),
            _pct(r.oracle_hit_share) if r.oracle_note is None or r.oracle_hit_share is not None
            else "not known", _pct(r.oracle_ideal_hit_share),
            _p50(r),
            _interval(ttft.p99 if ttft else None, r.ttft_p99_low_s, r.ttft_p99_high_s),
            "-" if r.imbalance is None else f"{r.imbalance:.2f}", per, str(r.failed), added,
            _predicted(r)]


def _predicted(r: ReplicasRecord) -> str:
    """The plan's hit share, TTFT p50 and requests per replica, made before the arm ran."""
    p = r.predicted
    if p is None:
        return "-"
    per = ", ".join(str(n) for n in p.requests_per_replica)
    return (f"hit {_pct(p.hit_share)}, TTFT p50 {_ms(p.ttft_s.p50 if p.ttft_s else None)} "
            f"ms, {per}")


def against(r: ReplicasRecord) -> str | None:
    """The plan's prediction against what the arm measured, each error said (None: no
    prediction)."""
    p = r.predicted
    if p is None:
        return f"the plan: {r.predicted_note}" if r.predicted_note else None
    parts = []
    if p.hit_share is not None and r.hit_rate is not None:
        parts.append(f"hit share {_pct(p.hit_share)} predicted, {_pct(r.hit_rate)} measured "
                     f"({100 * (p.hit_share - r.hit_rate):+.1f} points)")
    for q in ("p50", "p90"):
        want = getattr(p.ttft_s, q) if p.ttft_s else None
        seen = getattr(r.ttft_s, q) if r.ttft_s else None
        if want is not None and seen:
            parts.append(f"TTFT {q} {_ms(want)} ms predicted, {_ms(seen)} ms measured "
                         f"({100 * (want - seen) / seen:+.0f}%)")
    measured = [f"{c.requests:.0f}" if c.requests is not None else "?" for c in r.replicas]
    parts.append(f"requests per replica {p.requests_per_replica} predicted, "
                 f"[{', '.join(measured)}] measured")
    return "the plan, before the arm ran: " + "; ".join(parts)


def newest(records: Sequence[ReplicasRecord]) -> dict[str, list[ReplicasRecord]]:
    """Per prompt set, each arm's newest line, in the order the arms ran."""
    out: dict[str, dict[str, ReplicasRecord]] = {}
    for r in records:
        out.setdefault(r.prompt_set, {})[r.arm] = r
    return {k: list(v.values()) for k, v in out.items()}


def best(arms: Sequence[ReplicasRecord]) -> ReplicasRecord | None:
    """The arm the lab would run (see the module's docstring); None when none qualifies."""
    ok = [r for r in arms if not r.failed and r.ttft_s and r.ttft_s.p50 is not None]
    ok = [r for r in ok if (r.imbalance or 1.0) <= EVEN] or ok
    if not ok:
        return None
    fastest = min(ok, key=lambda r: r.ttft_s.p50 if r.ttft_s and r.ttft_s.p50 else 0.0)
    ceiling = fastest.ttft_p50_high_s or (fastest.ttft_s.p50 if fastest.ttft_s else None) or 0.0
    tied = [r for r in ok if (r.ttft_p50_low_s if r.ttft_p50_low_s is not None
                              else (r.ttft_s.p50 if r.ttft_s else None) or 0.0) <= ceiling]
    return max(tied, key=lambda r: (r.hit_rate or 0.0, -(r.imbalance or 0.0)))


def decision(prompt_set: str, arms: Sequence[ReplicasRecord]) -> str:
    """The lab's answer for one prompt set, with its figures."""
    chosen = best(arms)
    if chosen is None:
        return f"{prompt_set}: no arm ran without failures; no answer"
    n = len(chosen.replicas)
    uneven = "" if (chosen.imbalance or 1.0) <= EVEN else \
        f" (no arm kept its busiest replica within {EVEN}x the mean)"
    against = next((r for r in arms if r.arm == "round-robin" and r is not chosen), None)
    base = ""
    if against is not None:
        base = (f"; round-robin hit {_pct(against.hit_rate)} (oracle "
                f"{_pct(against.oracle_hit_share)}) at TTFT p50 {_p50(against)}")
    return (f"{prompt_set}: with {n} replicas run {chosen.arm} ({chosen.router}): hit rate "
            f"{_pct(chosen.hit_rate)} (the oracle: {_pct(chosen.oracle_hit_share)} for its "
            f"assignment, {_pct(chosen.oracle_ideal_hit_share)} ideal), TTFT p50 "
            f"{_p50(chosen)}, the busiest "
            f"replica {chosen.imbalance or 0:.2f}x the mean{uneven}{base}")


def replicas_table(book: Notebook) -> Table:
    """The replicas row as a table of its own: one line per arm and prompt set, the answer
    as each prompt set's chosen arm's verdict (the columns are `COLUMNS` less the first two)."""
    table = Table(REPLICAS.title, "Arm (prompt set)", list(COLUMNS[2:]))
    records = [r for r in book.records if isinstance(r, ReplicasRecord)]
    if not records:
        table.lines.append(missing(REPLICAS, book, len(COLUMNS) - 2))
        return table
    for prompt_set, arms in newest(records).items():
        chosen = best(arms)
        for r in arms:
            evidence = [f"{c.url}: {c.requests} requests, {c.prefix_cache_hits} of "
                        f"{c.prefix_cache_queries} prompt tokens hit" for c in r.replicas]
            if r.oracle_note:
                evidence.append(f"oracle: {r.oracle_note}")
            if r.router_added_from:
                evidence.append(f"router's own time: {r.router_added_from}")
            if (planned := against(r)) is not None:
                evidence.append(planned)
            if r is chosen:
                evidence.append(f"the lab's answer: {decision(prompt_set, arms)}")
            verdict = CHOSEN if r is chosen else "measured"
            table.lines.append(Line(f"{r.arm} ({prompt_set})", r.router, cells(r)[2:],
                                    evidence, verdict=verdict, command=REPLICAS.command,
                                    anchor=r.label))
    return table


def router(book: Notebook) -> Decision:
    """Which routing choice to run in front of N replicas: each prompt set's chosen arm
    (`best`), with every arm's hit share and TTFT median beside it."""
    records = [r for r in book.records if isinstance(r, ReplicasRecord)]
    if not records:
        return _undecided("pd", ROUTER_Q, _absent(book, REPLICAS.label, "the replicas lab"))
    sets = newest(records)
    chosen = {name: best(arms) for name, arms in sets.items()}
    rows = tuple(r.label for r in chosen.values() if r is not None)
    answer = "By prompt set, " + "; ".join(decision(name, arms) for name, arms in sets.items())
    picked = {name: r for name, r in chosen.items() if r is not None}
    if not picked:
        return Decision("pd", ROUTER_Q, f"{NOT_ENOUGH}: {answer}.", False, rows=rows,
                        headline=f"{NOT_ENOUGH}: no arm ran without failures")
    n = max(len(r.replicas) for r in picked.values())
    arms = {(r.arm, r.router) for r in picked.values()}
    if len(arms) == 1 and len(picked) == len(sets):
        arm, by = next(iter(arms))
        head = f"With {n} replicas, route by {arm} ({by})"
    else:
        head = f"With {n} replicas: " + ", ".join(
            f"{r.arm} for {name}" if r else f"none for {name}" for name, r in chosen.items())
    every = [r for arms_ in sets.values() for r in arms_]
    name = (lambda r: r.arm) if len(sets) == 1 else (lambda r: f"{r.arm}, {r.prompt_set}")
    picks = {id(r) for r in picked.values()}
    hits = Panel("share", "prompt tokens hit (%)", tuple(
        Mark(name(r), r.hit_rate or 0.0, chosen=id(r) in picks) for r in every))
    ttft = Panel("seconds", "TTFT p50, 95% interval", tuple(
        Mark(name(r), r.ttft_s.p50, r.ttft_p50_low_s, r.ttft_p50_high_s, id(r) in picks)
        for r in every if r.ttft_s is not None and r.ttft_s.p50 is not None))
    return Decision("pd", ROUTER_Q, f"{answer}.", True, rows=rows, headline=head,
                    outcome="choice").charted(hits, ttft)
