"""Are two labels' runs the same experiment? The checks `kvlab compare` adds to the seed's.

The facts each label's records state (model, prompt set and max tokens per level from the load
rows; context length, memory fraction, preamble, workload seed, endpoint, engine, block size
and KV cache type from any record of the label, the latest winning), and every way two runs
differ in them, as the warnings a comparison prints; the server's own prompt-token counts
more than `PROMPT_SIZE_TOLERANCE` apart are two workloads. A quantised KV cache is never
paired with an unquantised one (RefusedError).

Deliberately not here: which rows are paired (`pairing.py`), the engines' own arguments
(`engine_args.py`), and what a comparison does with the warnings (`compare.py`). Pure
functions of the notebook's records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from kvlab.core import RefusedError
from kvlab.measure.pressure import same_engines
from kvlab.records import (
    CapacityRecord,
    CrossingRecord,
    DiskRecord,
    LinkRecord,
    LoadRecord,
    PredictionRecord,
    Record,
    ReuseRecord,
    StartupRecord,
)

QUANTISED = frozenset({"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"})
T = TypeVar("T")


Fact = str | int | float


@dataclass(frozen=True)
class Facts:
    """Facts beyond the seed's three that make two runs the same experiment, as the records
    of one label stated them (None: none did)."""

    context_length: int | None = None
    memory_fraction: float | None = None
    preamble_tokens: int | None = None
    workload_seed: int | None = None
    endpoint: str | None = None
    engine: str | None = None
    block_size: int | None = None
    kv_cache_type: str | None = None

    def named(self) -> tuple[tuple[str, Fact | None], ...]:
        """Each fact by its field name, in the order the warnings say them."""
        return (("context_length", self.context_length),
                ("memory_fraction", self.memory_fraction),
                ("preamble_tokens", self.preamble_tokens),
                ("workload_seed", self.workload_seed), ("endpoint", self.endpoint),
                ("engine", self.engine), ("block_size", self.block_size),
                ("kv_cache_type", self.kv_cache_type))

    def then(self, newer: Facts) -> Facts:
        """These facts, each that `newer` states replaced by its value."""
        return Facts(context_length=_newer(self.context_length, newer.context_length),
                     memory_fraction=_newer(self.memory_fraction, newer.memory_fraction),
                     preamble_tokens=_newer(self.preamble_tokens, newer.preamble_tokens),
                     workload_seed=_newer(self.workload_seed, newer.workload_seed),
                     endpoint=_newer(self.endpoint, newer.endpoint),
                     engine=_newer(self.engine, newer.engine),
                     block_size=_newer(self.block_size, newer.block_size),
                     kv_cache_type=_newer(self.kv_cache_type, newer.kv_cache_type))


def _newer(old: T | None, new: T | None) -> T | None:
    return new if new is not None else old


def stated(record: Record) -> Facts:
    """The facts one record states, by the fields its kind declares."""
    if isinstance(record, LoadRecord):
        return Facts(context_length=record.context_length,
                     memory_fraction=record.memory_fraction,
                     preamble_tokens=record.preamble_tokens, workload_seed=record.workload_seed,
                     endpoint=record.endpoint, engine=record.engine,
                     kv_cache_type=record.kv_cache_type)
    if isinstance(record, CapacityRecord):
        return Facts(context_length=record.context_length,
                     memory_fraction=record.memory_fraction, kv_cache_type=record.kv_cache_type)
    if isinstance(record, StartupRecord):
        return Facts(memory_fraction=record.memory_fraction, engine=record.engine)
    if isinstance(record, ReuseRecord | DiskRecord):
        return Facts(engine=record.engine, kv_cache_type=record.kv_cache_type)
    if isinstance(record, LinkRecord):
        return Facts(context_length=record.context_length)
    if isinstance(record, PredictionRecord | CrossingRecord):
        return Facts(block_size=record.block_size)
    return Facts()


def label_facts(records: list[Record], label: str) -> Facts:
    """Facts any record of `label` states (load rows, link, startup), the latest winning."""
    out, labels = Facts(), same_engines(label)
    for record in records:
        if record.label in labels:
            out = out.then(stated(record))
    return out


def check_kv_types(a: str, b: str, facts_a: Facts, facts_b: Facts) -> None:
    """Refuse to pair a quantised KV cache (q8_0, q4_0, ...) with an unquantised one."""
    ta, tb = facts_a.kv_cache_type, facts_b.kv_cache_type
    if ta is None or tb is None or ta == tb:
        return
    if (ta in QUANTISED) != (tb in QUANTISED):
        raise RefusedError(
            f"{a} ran with kv_cache_type {ta} and {b} with {tb}: a quantised KV cache against an "
            "unquantised one measures the quantisation, not the tier; run both with the same "
            "LLAMA_CACHE_TYPE")


def experiment_warnings(a: str, b: str, rows_a: dict[int, LoadRecord],
                        rows_b: dict[int, LoadRecord],
                        facts_a: Facts, facts_b: Facts) -> list[str]:
    """Every way the two runs differ; empty when they are the same experiment."""
    out = []
    for level in sorted(set(rows_a) & set(rows_b)):
        d, base = rows_a[level], rows_b[level]
        seeds: tuple[tuple[str, Fact | None, Fact | None], ...] = (
            ("model", d.model, base.model), ("prompt_set", d.prompt_set, base.prompt_set),
            ("max_tokens", d.max_tokens, base.max_tokens))
        for key, mine, theirs in seeds:
            if mine != theirs:
                out.append(f"  concurrency {level}: {key} differs ({mine!r} against {theirs!r})")
        out += _prompt_size_warning(level, d, base)
    if set(rows_a) != set(rows_b):
        out.append(f"  concurrency levels differ ({sorted(rows_a)} against {sorted(rows_b)})")
    for (key, mine), (_, theirs) in zip(facts_a.named(), facts_b.named(), strict=True):
        if mine is not None and theirs is not None and mine != theirs:
            out.append(f"  {key} differs ({mine!r} against {theirs!r})")
    return out


PROMPT_SIZE_TOLERANCE = 0.05  # the same prompts, counted by the server, differ by less


def _prompt_size_warning(level: int, a: LoadRecord, b: LoadRecord) -> list[str]:
    """The servers' own prompt-token counts: the same workload sized two ways is two
    experiments (e.g. one side sized by the tokenizer, the other by the word estimate)."""
    ma, mb = a.prompt_tokens_mean, b.prompt_tokens_mean
    if not ma or not mb or abs(ma - mb) <= PROMPT_SIZE_TOLERANCE * max(ma, mb):
        return []
    return [f"  concurrency {level}: the server counted {ma:,.0f} prompt tokens a request "
            f"against {mb:,.0f}: the prompts differ in size"]
