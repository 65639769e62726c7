"""The line `kvlab run replicas` writes per arm: N replicas behind one front, one routing choice.

Every figure says where it came from: the hit rate and requests per replica from each
replica's own /metrics (deltas around the arm's load), TTFT from the load generator's
per-request lines through the front, the oracle's figures from `measure.oracle` replayed over
the exact tokens the engine's /tokenize gives, and the router's added latency from the router's
own /metrics where it keeps one.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Record, Strict
from kvlab.records.evidence import Percentiles


class ReplicaCounts(Strict):
    """One replica's counters over the arm's load (deltas of its /metrics)."""

    url: str
    requests: float | None = Field(None, description="vllm:request_success delta.")
    prefix_cache_queries: float | None = Field(None, description="Prompt tokens looked up.")
    prefix_cache_hits: float | None = Field(None, description="Of them, found cached.")
    assigned: int | None = Field(None, description="Requests the router's pick log sent here.")
    failures: int | None = Field(None, description="Requests that failed on this replica, as "
                                 "the router's pick log and the load generator's lines show.")


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
    note: str | None = None
