"""Per-replica evidence: counts from each engine's deltas, their sum, their shares, and the
replica whose prefix cache found far less than the others' named."""

from __future__ import annotations

from kvlab.records import ReplicaCounts
from kvlab.records import replicas as replica_counts


def counted(url: str, queries: float | None, hits: float | None,
            requests: float | None = 10) -> ReplicaCounts:
    return ReplicaCounts(url=url, requests=requests, prefix_cache_queries=queries,
                         prefix_cache_hits=hits)


def test_a_replica_with_no_hits_beside_others_that_hit_is_named() -> None:
    found = [counted("http://a/metrics", 1000, 600), counted("http://b/metrics", 1000, 0),
             counted("http://c/metrics", 1000, 500)]
    note = replica_counts.far_below(found)
    assert note is not None
    assert "http://b/metrics found 0.0% of its 1,000 prompt tokens cached against 55.0%" in note
    assert "http://a" not in note and "http://c" not in note


def test_replicas_that_all_hit_alike_or_all_miss_are_not_named() -> None:
    assert replica_counts.far_below([counted("a", 1000, 400), counted("b", 1000, 300)]) is None
    # nothing to reuse anywhere: no replica is set against the others
    assert replica_counts.far_below([counted("a", 1000, 50), counted("b", 1000, 0)]) is None
    assert replica_counts.far_below([counted("a", 1000, 0)]) is None


def test_a_replica_that_looked_nothing_up_is_named_against_what_it_was_sent() -> None:
    off = ReplicaCounts(url="b", requests=6, prefix_cache_queries=0, prefix_cache_hits=0,
                        prompt_tokens=2211)
    on = ReplicaCounts(url="a", requests=6, prefix_cache_queries=2224, prefix_cache_hits=1280,
                       prompt_tokens=2224)
    note = replica_counts.far_below([on, off])
    assert note is not None
    assert "b found 0.0% of its 2,211 prompt tokens cached (it looked none of them up) " \
        "against 57.6% on the others" in note
    assert replica_counts.hit_share([on, off]) == 1280 / (2224 + 2211)


def test_a_replica_without_prefix_counters_is_named_as_such() -> None:
    note = replica_counts.far_below([counted("a", 1000, 500), counted("b", None, None)])
    assert note is not None and "b reports no prefix-cache counters" in note


def test_llama_server_counters_read_as_queries_and_hits() -> None:
    c = replica_counts.of_deltas("u", {"prompt_tokens_total": 300, "prompt_tokens_cached_total":
                                       700})
    assert (c.prefix_cache_queries, c.prefix_cache_hits, c.requests, c.prompt_tokens) \
        == (1000, 700, None, 1000)


def test_sum_keeps_only_keys_every_replica_has() -> None:
    assert replica_counts.summed([{"prefix_cache_hits": 3, "preemptions": 1},
                                  {"prefix_cache_hits": 4.5, "preemptions": None}]) \
        == {"prefix_cache_hits": 7.5}
    assert replica_counts.summed([]) == {}


def test_shares_are_of_requests_or_of_prompt_tokens_when_one_counts_none() -> None:
    both = [counted("a", 100, 0, requests=3), counted("b", 300, 0, requests=1)]
    assert replica_counts.shares(both) == [0.75, 0.25]
    one = [counted("a", 100, 0, requests=3), counted("b", 300, 0, requests=None)]
    assert replica_counts.shares(one) == [0.25, 0.75]
