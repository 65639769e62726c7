"""The stores two vLLM instances share (`kvlab run shared`, `--store lmcache`), for the offload
table and the store decision: which stores' rows to show, what a store held against the KV
arithmetic, and why a store did or did not serve turn 2 on the other instance, from how its
connector matches a prompt (`core/connectors.py`: whole prompts or prefixes in chunks).

The rows themselves are `offload.py`'s and the decision `decisions_tiers.py`'s; nothing here
measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core import connectors
from kvlab.records import SHARED_ROWS, Notebook, ReuseRecord, Row
from kvlab.report.common import kv_bytes_per_token, latest, not_run, startup_of


@dataclass(frozen=True)
class Store:
    """One store the lab can run: its connector and its rows (alternating, control, proof)."""

    connector: connectors.Connector
    alternating: Row
    single: Row
    proof: Row

    @property
    def seed(self) -> bool:
        """Whether it is the seed's store (ExampleConnector's directory), always shown."""
        return connectors.is_shared_store(self.connector.name)


STORES = tuple(Store(connectors.store(name), *rows) for name, rows in SHARED_ROWS.items())


def shown(book: Notebook) -> list[Store]:
    """The stores the offload table shows: the seed's always (its row says how to measure
    it), any other where the notebook has its line or says why it did not run."""
    return [s for s in STORES if s.seed or latest(book, ReuseRecord, s.alternating.label)
            or not_run(book, s.alternating.label)]


def ran(book: Notebook) -> list[tuple[Store, ReuseRecord]]:
    """The stores whose alternating run is in the notebook, with its newest line."""
    return [(s, r) for s in STORES if (r := latest(book, ReuseRecord, s.alternating.label))]


def held_words(book: Notebook, r: ReuseRecord) -> str | None:
    """What the store held after the run, as it says, against the KV arithmetic (entries x
    tokens an entry holds x KV bytes a token, as the engine's startup sized its cache)."""
    held = r.store
    if held is None:
        return None
    of = f" of its {held.capacity_bytes / 2**30:g} GiB" if held.capacity_bytes else ""
    words = f"the store held {held.bytes:,} bytes in {held.objects} chunks{of} ({held.source})"
    per = kv_bytes_per_token(startup_of(book, r))
    if not held.chunk_tokens or per is None:
        return words + ("; bytes per token not recorded, so not checked against the KV "
                        "arithmetic" if held.objects else "")
    expected = held.objects * held.chunk_tokens * per[0]
    sum_ = f"{held.objects} chunks x {held.chunk_tokens} tokens x {per[0]:,.0f} B/token"
    if not expected:
        return f"{words}: it held nothing"
    ratio = held.bytes / expected
    sign = "=" if f"{ratio:.2f}" == "1.00" else f"against {expected:,.0f} bytes ="
    return (f"{words}: {held.bytes:,} bytes {sign} {sum_} ({ratio:.2f}x the KV arithmetic; "
            f"B/token from {per[1]})")


def turn2(r: ReuseRecord) -> str:
    """Turn 2 on the other instance: its verdict and what it took from the store."""
    if len(r.rows) < 2:
        return "no turn 2 ran"
    row = r.rows[1]
    verdict = r.summary.later_turn_verdicts[0] if r.summary is not None and \
        r.summary.later_turn_verdicts else row.verdict or "not judged"
    took = (f", {row.cached_tokens:,} of {row.prompt_tokens:,} prompt tokens from cache"
            if row.cached_tokens is not None and row.prompt_tokens else "")
    return f"{verdict}{took}"


def why(store: Store, r: ReuseRecord, paid: bool) -> str:
    """Why the store did or did not serve turn 2 of a growing conversation on the other
    instance, from how its connector matches a prompt."""
    c = store.connector
    if c.prefix_match:
        piece = f"in {c.match_tokens}-token chunks" if c.match_tokens else "by blocks"
        found = r.rows[1].cached_tokens if len(r.rows) > 1 else None
        return (f"{c.called} finds a stored prefix {piece}, so turn 2's longer prompt "
                + (f"found turn 1's {found:,} tokens" if paid and found
                   else "found no whole chunk of turn 1's"))
    return (f"{c.called} keys a stored prompt whole, so turn 2's longer prompt "
            + ("still matched one (it grew by less than a block)" if paid
               else "found nothing of turn 1's"))
