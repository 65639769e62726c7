"""The oracle beside a level with LMCache's tier under the device: found in 256-token chunks
from the first token and written on every prefill, where vLLM's own is found block by block."""

from __future__ import annotations

from kvlab.engines.base import CacheShape
from kvlab.loadgen import oracle_level
from kvlab.records.requests import RequestLine

BLOCK = 16


def level(tokens: list[list[int]]) -> list[RequestLine]:
    return [RequestLine(id=i, level=1, prompt_index=i, sent_s=float(i), status="ok",
                        cached_tokens=0) for i in range(len(tokens))]


def test_lmcaches_tier_serves_whole_chunks_where_blocks_would_serve_more() -> None:
    prompt = list(range(400))  # one whole chunk of 256, then 144 more tokens (9 blocks)
    other = list(range(1000, 1400))
    tokens = [prompt, other, prompt]  # the device holds one prompt: the third recalls
    shape = CacheShape("blocks", "test", BLOCK, blocks=400 // BLOCK)
    native = oracle_level._blocks(shape, level(tokens), tokens, 100, (), [], "test")
    lines = level(tokens)
    chunked = oracle_level._blocks(shape, lines, tokens, 100, (), [], "test", 256)
    assert native.predicted_cached_tokens == 384  # 24 whole blocks, the 25th's last token
    assert chunked.predicted_cached_tokens == 256  # one chunk
    assert lines[2].oracle_cached_tokens == 256
    assert "whole chunks of 256 tokens" in chunked.cache_model
    assert "chunks" not in native.cache_model
