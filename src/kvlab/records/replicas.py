"""The line `kvlab run replicas` writes per arm: N replicas behind one front, one routing choice.

Every figure says where it came from: the hit rate and requests per replica from each
replica's own /metrics (deltas around the arm's load), TTFT from the load generator's
per-request lines through the front, the oracle's figures from `measure.oracle` replayed over
the exact tokens the engine's /tokenize gives, and the router's added latency from the router's
own /metrics where it keeps one.

`kvlab load` with several `--metrics-url` (replicas behind a front: kvlab's proxy with
`--replica`, vllm-router) keeps the same counts on its row: the front has no prefix cache of
its own, so the level's counters are the replicas' sum, and a replica whose prefix cache
finds far less than the others' (caching off, a cache too small) is named (`far_below`)
instead of averaged away.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Deltas, Record, Strict
from kvlab.records.evidence import Percentiles
from kvlab.records.plan import PlanPoint


class ReplicaCounts(Strict):
    """One replica's counters over the arm's load (deltas of its /metrics)."""

    url: str
    requests: float | None = Field(None, description="vllm:request_success delta.")
    prefix_cache_queries: float | None = Field(None, description="Prompt tokens looked up.")
    prefix_cache_hits: float | None = Field(None, description="Of them, found cached.")
    prompt_tokens: float | None = Field(None, description="Prompt tokens it was sent (with "
                                        "prefix caching off it looks none of them up).")
    assigned: int | None = Field(None, description="Requests the router's pick log sent here.")
    failures: int | None = Field(None, description="Requests that failed on this replica, as "
                                 "the router's pick log and the load generator's lines show.")
    share: float | None = Field(None, description="Its share of the requests the replicas "
                                "counted (of their prompt tokens where one counts no requests).")


class ReplicasRecord(Record):
    """One arm: the replicas, the routing choice, the workload, and what came of it."""

    kind: ClassVar[str] = "replicas"
    record: Literal["replicas"] = "replicas"
    arm: str = Field(description="The routing choice (round-robin, prefix-affinity, ...).")
    router: str = Field(description="Who routed: kvlab's proxy or vllm-router (and version).")
    policy: str = Field(description="The router's own name for its policy, as passed.")
    prompt_set: str
    groups: int | None = Field(None, description="shared-prefix: how many preambles.")
    seed: int = Field(description="The workload's seed (each arm its own: no arm finds "
                      "another's prefixes cached).")
    replicas: list[ReplicaCounts]
    concurrency: int
    requests: int = Field(description="Requests sent through the front.")
    failed: int = 0
    block_tokens: int | None = Field(None, description="The replicas' KV block size "
                                     "(vllm:cache_config_info).")
    device_blocks: int | None = Field(None, description="Blocks one replica's cache holds.")
    hit_rate: float | None = Field(None, description="Sum of the replicas' prefix-cache hits "
                                   "over their queries, in tokens.")
    imbalance: float | None = Field(None, description="The busiest replica's requests over "
                                    "the mean (1 = even), from the replicas' counters.")
    ttft_s: Percentiles | None = None
    ttft_p50_low_s: float | None = Field(None, description="95% bootstrap interval of the "
                                         "TTFT median, over requests.")
    ttft_p50_high_s: float | None = None
    ttft_p99_low_s: float | None = None
    ttft_p99_high_s: float | None = None
    oracle_hit_share: float | None = Field(None, description="The oracle's share of prompt "
                                           "tokens served from cache with this arm's actual "
                                           "assignment (each replica's requests replayed "
                                           "through its own cache).")
    oracle_ideal_hit_share: float | None = Field(None, description="The oracle's share with one "
                                                 "cache of N x the blocks: every prefix "
                                                 "computed once across the replicas.")
    oracle_note: str | None = Field(None, description="Why an oracle figure is missing.")
    router_added_s: float | None = Field(None, description="The router's own mean time "
                                         "before the first byte, from its /metrics.")
    router_added_from: str | None = None
    load_label: str | None = Field(None, description="The load row of this arm.")
    predicted: PlanPoint | None = Field(None, description="`kvlab plan`'s simulation of this "
                                        "arm, made before it ran, from a profile measured on "
                                        "the first replica (its replica_profile line).")
    predicted_note: str | None = Field(None, description="Why the arm has no prediction.")
    note: str | None = None


# a replica is named when its hit rate is below this fraction of the others' pooled rate,
# and the others find at least FLOOR of their prompt tokens cached (so two cold replicas
# on a workload with nothing to reuse are not set against each other)
FAR_BELOW = 0.5
FLOOR = 0.1


def counts(urls: Sequence[str], each: Sequence[Deltas]) -> list[ReplicaCounts]:
    """Each replica's requests, prompt tokens looked up and found cached over the level,
    from its evidence deltas (`engines.evidence_deltas` of its two scrapes)."""
    return [of_deltas(url, moved) for url, moved in zip(urls, each, strict=True)]


def of_deltas(url: str, moved: Deltas) -> ReplicaCounts:
    """One replica's counts from its evidence deltas (vLLM's block queries and hits, or
    llama-server's prompt tokens computed and cached)."""
    queries, hits = moved.get("prefix_cache_queries"), moved.get("prefix_cache_hits")
    prompt = moved.get("prompt_tokens")
    cached, computed = moved.get("prompt_tokens_cached_total"), moved.get("prompt_tokens_total")
    if queries is None and cached is not None and computed is not None:
        queries = prompt = cached + computed
        hits = cached
    return ReplicaCounts(url=url, requests=moved.get("requests_succeeded"),
                         prefix_cache_queries=queries, prefix_cache_hits=hits,
                         prompt_tokens=prompt)


def summed(each: list[Deltas]) -> Deltas:
    """The replicas' deltas added key by key (a key any replica lacks is left out: a sum
    over some of them would read as the whole)."""
    if not each:
        return {}
    keys = set.intersection(*({k for k, v in d.items() if v is not None} for d in each))
    return {key: round(sum(float(d[key] or 0) for d in each), 3) for key in sorted(keys)}


def _whole(c: ReplicaCounts) -> float | None:
    """The prompt tokens it was sent (those it looked up where it does not count them)."""
    return c.prompt_tokens or c.prefix_cache_queries


def rate(c: ReplicaCounts) -> float | None:
    """Its share of the prompt tokens it was sent that it found cached."""
    whole = _whole(c)
    if whole and c.prefix_cache_queries is not None:
        return (c.prefix_cache_hits or 0.0) / whole
    return None


def hit_share(found: list[ReplicaCounts]) -> float | None:
    """The replicas' hits over the prompt tokens they were all sent (a replica that looks
    nothing up counts in the whole), or None where one says neither."""
    wholes = [_whole(c) for c in found]
    if any(w is None for w in wholes) or not sum(w or 0.0 for w in wholes):
        return None
    return sum(c.prefix_cache_hits or 0.0 for c in found) / sum(w or 0.0 for w in wholes)


def shares(found: list[ReplicaCounts]) -> list[float | None]:
    """Each replica's share of the requests (of the prompt tokens where a replica does not
    count requests)."""
    by_requests = all(c.requests is not None for c in found)
    values = [(c.requests if by_requests else c.prefix_cache_queries) or 0.0 for c in found]
    whole = sum(values)
    return [round(v / whole, 4) if whole else None for v in values]


def far_below(found: list[ReplicaCounts]) -> str | None:
    """A sentence naming each replica whose prefix cache found far less than the others'
    together, or None when none did (or fewer than two replicas were read)."""
    if len(found) < 2:
        return None
    named = []
    for i, c in enumerate(found):
        pooled = hit_share([o for j, o in enumerate(found) if j != i])
        if pooled is None or pooled < FLOOR:
            continue
        mine = rate(c)
        if mine is None:
            named.append(f"{c.url} reports no prefix-cache counters (the others find "
                         f"{pooled:.1%} cached)")
        elif mine < FAR_BELOW * pooled:
            whole = _whole(c) or 0.0
            looked = " (it looked none of them up)" if whole and not c.prefix_cache_queries \
                else ""
            named.append(f"{c.url} found {mine:.1%} of its {whole:,.0f} prompt tokens cached"
                         f"{looked} against {pooled:.1%} on the others")
    if not named:
        return None
    return ("replica far below the others: " + "; ".join(named)
            + " (is its prefix caching on? `kvlab check` compares the replicas)")
