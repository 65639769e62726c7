"""KV arithmetic against hand-computed goldens."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.core.errors import InputError
from kvlab.measure import kvmath

DATA = Path(__file__).parents[2] / "data"


def test_qwen3_8b_golden() -> None:
    shape = kvmath.load_shape(DATA / "qwen3-8b-config.json")
    assert (shape.layers, shape.kv_heads, shape.key_dim) == (36, 8, 128)
    assert shape.bytes_per_token() == 147_456


def test_qwen3_1_7b_golden() -> None:
    assert kvmath.load_shape(DATA / "qwen3-1.7b-config.json").bytes_per_token() == 114_688


def test_model_directory_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((DATA / "qwen3-8b-config.json").read_text())
    assert kvmath.load_shape(tmp_path).bytes_per_token() == 147_456


@pytest.mark.parametrize(("dtype", "expected"), [
    ("bf16", 147_456), ("fp16", 147_456), ("fp8", 73_728), ("fp32", 294_912),
    ("q8_0", 147_456 / 2 * 34 / 32), ("q4_0", 147_456 / 2 * 18 / 32),
])
def test_dtypes(dtype: str, expected: float) -> None:
    shape = kvmath.load_shape(DATA / "qwen3-8b-config.json")
    assert shape.bytes_per_token(dtype) == pytest.approx(expected)


def test_done_criterion_payload_and_transfer() -> None:
    shape = kvmath.load_shape(DATA / "qwen3-8b-config.json")
    p = kvmath.predict(shape, prompt_tokens=4096, link_bytes_per_s=kvmath.gbps_to_bytes_per_s(10))
    assert p.payload_bytes == 603_979_776
    assert p.transfer_s == pytest.approx(0.483, rel=0.01)
    assert p.ttft_prediction is not None and p.ttft_prediction.startswith("worse")


def test_block_alignment_and_concurrency() -> None:
    shape = kvmath.load_shape(DATA / "qwen3-8b-config.json")
    p = kvmath.predict(shape, prompt_tokens=1000, block_size=16, kv_cache_tokens=34_952,
                       ctx=8192)
    assert p.payload_bytes_block_aligned == 1008 * 147_456
    assert p.max_concurrency == pytest.approx(4.27, abs=0.01)
    by_bytes = kvmath.predict(shape, kv_cache_bytes=147_456 * 8192 * 2, ctx=8192)
    assert by_bytes.kv_cache_tokens == 16_384 and by_bytes.max_concurrency == 2.0


def test_gguf_metadata_and_quantised_types(tiny_models: object) -> None:
    from kvlab.engines.models import TinyModels

    assert isinstance(tiny_models, TinyModels)
    shape = kvmath.load_shape(Path(tiny_models.gguf))
    assert (shape.layers, shape.kv_heads, shape.key_dim, shape.value_dim) == (4, 2, 64, 64)
    assert shape.bytes_per_token("f16") == 2048
    assert shape.bytes_per_token("q8_0") == 1088  # 4 x 2 x 128 x 34/32
    assert shape.bytes_per_token("q4_0") == 576
    hf = kvmath.load_shape(Path(tiny_models.hf))
    assert hf.bytes_per_token() == 2048


def test_mla_and_incomplete_configs_are_refused() -> None:
    with pytest.raises(InputError, match="MLA"):
        kvmath.shape_from_config_dict({"kv_lora_rank": 512, "num_hidden_layers": 2}, "x")
    with pytest.raises(InputError, match="num_hidden_layers"):
        kvmath.shape_from_config_dict({"num_attention_heads": 2}, "x")
    with pytest.raises(InputError, match="not known"):
        kvmath.element_bytes("int3")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        kvmath.load_shape(tmp_path / "missing.json")
