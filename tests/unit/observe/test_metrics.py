"""Counter deltas: summed over engines, _created ignored, old and _total names, resets."""

from __future__ import annotations

from kvlab.engines import registry
from kvlab.observe import metrics

VLLM_BEFORE = """\
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7959456127666988e+09
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 50.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 100.0
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 100.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 300.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0
"""
VLLM_AFTER = VLLM_BEFORE.replace(
    'engine="0",model_name="m"} 100.0\n', 'engine="0",model_name="m"} 1100.0\n', 1
).replace("400.0", "2400.0").replace("} 0.0\n", "} 0.25\n")


def test_deltas_sum_over_engines_and_ignore_created() -> None:
    before, after = metrics.parse(VLLM_BEFORE), metrics.parse(VLLM_AFTER)
    engine = registry.source_of(after)
    assert engine is not None and engine.name == "vllm"
    assert before.total("vllm:prefix_cache_hits") == 150.0  # created timestamp not summed
    assert before.total("vllm:prefix_cache_hits_total") == 150.0
    deltas = metrics.evidence_deltas(before, after, engine)
    assert deltas["prefix_cache_hits"] == 1000.0
    assert deltas["prefix_cache_queries"] == 2000.0
    assert deltas["kv_cache_usage_perc_end"] == 0.25
    assert metrics.hit_rate(deltas) == 0.5


def test_label_filter() -> None:
    snap = metrics.parse(VLLM_BEFORE)
    assert snap.total("vllm:prompt_tokens_by_source", {"source": "local_compute"}) == 300.0


def test_counter_reset_counts_the_new_value() -> None:
    before = metrics.parse(VLLM_AFTER)
    after = metrics.parse(VLLM_BEFORE)  # engine restarted: counters went down
    # engine 0 restarted (1100 -> 100: its delta is 100); engine 1 unchanged (50 -> 50)
    assert metrics.counter_delta(before, after, "vllm:prefix_cache_hits") == 100.0


def test_absent_metric_is_none_not_zero() -> None:
    snap = metrics.parse(VLLM_BEFORE)
    assert metrics.counter_delta(snap, snap, "vllm:nixl_bytes_transferred") is None
    assert "external_prefix_cache_hits" not in metrics.evidence_deltas(snap, snap,
                                                                        registry.source_of(snap))


def test_llama_server_counters() -> None:
    before = metrics.parse("# TYPE llamacpp:prompt_tokens_total counter\n"
                           "llamacpp:prompt_tokens_total 2000\n"
                           "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
                           "llamacpp:prompt_tokens_cached_total 0\n")
    after = metrics.parse("# TYPE llamacpp:prompt_tokens_total counter\n"
                          "llamacpp:prompt_tokens_total 2001\n"
                          "# TYPE llamacpp:prompt_tokens_cached_total counter\n"
                          "llamacpp:prompt_tokens_cached_total 1997\n")
    deltas = registry.evidence_deltas(before, after)  # the engine found from the scrape
    assert deltas == {"prompt_tokens_total": 1.0, "prompt_tokens_cached_total": 1997.0}
    assert metrics.hit_rate(deltas) == 1997 / 1998


def test_metrics_url() -> None:
    assert metrics.metrics_url("http://h:1/v1") == "http://h:1/metrics"
    assert metrics.metrics_url("http://h:1/v1/") == "http://h:1/metrics"
    assert metrics.metrics_url("http://h:1") == "http://h:1/metrics"
