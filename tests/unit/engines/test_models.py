"""Tiny models: deterministic bytes, one tokenizer for both engines, shaped configs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kvlab.engines.models import TinyModels, make_tiny, write_shaped_config


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_deterministic_across_builds(tmp_path: Path, tiny_models: TinyModels) -> None:
    again = make_tiny(tmp_path / "again")
    assert digest(Path(again.gguf)) == digest(Path(tiny_models.gguf))
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert digest(Path(again.hf) / name) == digest(Path(tiny_models.hf) / name)


def test_hf_directory_is_a_qwen3_with_chat_template(tiny_models: TinyModels) -> None:
    hf = Path(tiny_models.hf)
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["num_key_value_heads"] == 2
    tok_config = json.loads((hf / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]


def test_shaped_config_has_no_weights(tmp_path: Path) -> None:
    out = write_shaped_config(tmp_path / "q8b", "qwen3-8b")
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (
        36, 8, 128)
    assert not list(out.glob("*.safetensors"))
