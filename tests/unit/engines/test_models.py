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


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Each model file's inode and modification time: what a rewrite changes."""
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_made_once_whatever_path_reaches_the_models(tmp_path: Path) -> None:
    # #48 finding 11: a home reached through a symlink rewrote the models in place
    real = tmp_path / "home" / "models" / "tiny"
    make_tiny(real)
    before = _files(real)
    (tmp_path / "link").symlink_to(tmp_path / "home")
    again = make_tiny(tmp_path / "link" / "models" / "tiny")
    assert _files(real) == before  # nothing rewritten
    assert again.gguf == str(tmp_path / "link" / "models" / "tiny" / "tiny.gguf")
    assert not list((tmp_path / "home" / "models").glob(".partial-*"))


def test_a_changed_model_is_remade_beside_it_never_in_place(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    made = make_tiny(out)
    weights = Path(made.hf) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")  # the digest no longer matches
    gguf = Path(made.gguf)
    size, inode = gguf.stat().st_size, gguf.stat().st_ino
    with gguf.open("rb") as served:  # as a running engine holds it
        make_tiny(out)
        assert len(served.read()) == size  # its file was not truncated under it
    assert gguf.stat().st_ino != inode  # a new file renamed over the name
    stamp = json.loads((out / "kvlab-models.json").read_text())
    assert stamp["files"]["hf/model.safetensors"]["sha256"] == digest(weights)
    assert stamp["files"]["tiny.gguf"]["bytes"] == size


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
