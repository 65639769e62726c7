"""GGUFs written from an HF directory (`engines/gguf_make.py`): llama.cpp's name for each HF
tensor, the shapes config.json gives them, every way a directory is refused (a tensor
missing, unknown, of another shape or type; another architecture or tokenizer), and what is
written: the weights' own bytes (bf16 kept as bf16, norms widened to f32), random weights for
a config-only directory, and nothing half-written when a write fails. The tiny generated
model is the source (`kvlab models tiny`'s HF directory, made here in a temporary folder)."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from kvlab.core.errors import InputError
from kvlab.engines import gguf_make
from kvlab.engines.gguf_tokens import Tokenizer
from kvlab.engines.models import KNOWN_SHAPES, make_tiny, write_shaped_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(make_tiny(tmp_path_factory.mktemp("tiny") / "tiny").hf)


def copy(tiny: Path, where: Path) -> Path:
    shutil.copytree(tiny, where)
    return where


def header(path: Path) -> tuple[dict[str, dict[str, object]], int]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size)), 8 + size


def test_every_hf_name_has_llama_cpps_and_nothing_else_does() -> None:
    assert gguf_make.gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_make.gguf_name("model.norm.weight") == "output_norm.weight"
    assert gguf_make.gguf_name("lm_head.weight") == "output.weight"
    assert gguf_make.gguf_name("model.layers.12.self_attn.q_proj.weight") == "blk.12.attn_q.weight"
    assert gguf_make.gguf_name("model.layers.0.self_attn.k_norm.weight") == \
        "blk.0.attn_k_norm.weight"
    assert gguf_make.gguf_name("model.layers.3.mlp.down_proj.weight") == "blk.3.ffn_down.weight"
    assert gguf_make.gguf_name("model.layers.3.post_attention_layernorm.weight") == \
        "blk.3.ffn_norm.weight"
    for unknown in ("model.layers.0.self_attn.q_proj.bias", "model.layers.x.mlp.up_proj.weight",
                    "model.layers.0.mlp.experts.0.up_proj.weight", "transformer.wte.weight"):
        assert gguf_make.gguf_name(unknown) is None, unknown


def test_the_8b_shapes_tensors_are_its_configs(tmp_path: Path) -> None:
    model = write_shaped_config(tmp_path / "8b", "qwen3-8b")
    dims = gguf_make.Dims.of(json.loads((model / "config.json").read_text()), "8b")
    shape = KNOWN_SHAPES["qwen3-8b"]
    shapes = dims.shapes()
    assert len(shapes) == 2 + 11 * shape.layers  # embedding, final norm, 11 a layer; tied
    assert shapes["model.layers.35.self_attn.q_proj.weight"] == (32 * 128, 4096)
    assert shapes["model.layers.35.self_attn.k_proj.weight"] == (8 * 128, 4096)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (4096, 32 * 128)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (4096, 12288)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (128,)
    assert next(iter(shapes)) == "model.embed_tokens.weight" and "lm_head.weight" not in shapes
    untied = gguf_make.Dims.of({**json.loads((model / "config.json").read_text()),
                                "tie_word_embeddings": False}, "8b")
    assert untied.shapes()["lm_head.weight"] == (dims.vocab, 4096)


def test_a_directory_kvlab_cannot_write_is_refused_naming_what(tiny: Path,
                                                               tmp_path: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    with pytest.raises(InputError, match=r"LlamaForCausalLM.*set LLAMA_MODEL"):
        gguf_make.Dims.of({**config, "architectures": ["LlamaForCausalLM"]}, "m")
    with pytest.raises(InputError, match="'num_hidden_layers' is missing"):
        gguf_make.Dims.of({k: v for k, v in config.items() if k != "num_hidden_layers"}, "m")
    dims = gguf_make.Dims.of(config, "m")
    weights = tiny / "model.safetensors"
    stored = gguf_make.read_header(weights)
    assert gguf_make.checked(stored, dims, "m").keys() == dims.shapes().keys()
    name = "model.layers.1.self_attn.q_proj.weight"
    q = stored[name]
    cases = (
        (stored | {name: gguf_make.Stored(q.file, q.offset, "BF16", (128, 256))},
         r"q_proj.weight has shape \[128, 256\], where config.json makes it \[256, 256\]"),
        ({k: v for k, v in stored.items() if k != "model.norm.weight"},
         "no tensor model.norm.weight"),
        (stored | {"model.layers.0.self_attn.q_proj.bias": q},
         "q_proj.bias is not part of a 4-layer Qwen3 decoder"),
        (stored | {name: gguf_make.Stored(q.file, q.offset, "I8", q.shape)},
         "q_proj.weight is I8; kvlab reads BF16, F16, F32"),
    )
    for found, words in cases:
        with pytest.raises(InputError, match=words):
            gguf_make.checked(found, dims, "m")
    # a tied checkpoint that carries lm_head anyway, and rotary buffers: left out
    extra = stored | {"lm_head.weight": stored["model.embed_tokens.weight"],
                      "model.layers.0.self_attn.rotary_emb.inv_freq": q}
    assert "lm_head.weight" not in gguf_make.checked(extra, dims, "m")
    other = copy(tiny, tmp_path / "other")
    spec = json.loads((other / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "_"}
    (other / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(InputError, match="GPT-2's pre-tokenizer only; set LLAMA_MODEL"):
        Tokenizer.of(other, dims.vocab)


def test_the_gguf_holds_the_weights_own_bytes_and_the_tokenizer(tiny: Path,
                                                                tmp_path: Path) -> None:
    made = gguf_make.from_hf(tiny, tmp_path / "made" / "tiny-bf16.gguf")
    assert [p.name for p in made.parent.iterdir()] == ["tiny-bf16.gguf"]  # no temporary left
    reader = GGUFReader(str(made))
    tensors = {t.name: t for t in reader.tensors}
    entries, start = header(tiny / "model.safetensors")
    raw = (tiny / "model.safetensors").read_bytes()
    for hf, entry in entries.items():
        if hf == "__metadata__":
            continue
        gg = gguf_make.gguf_name(hf)
        assert gg is not None and gg in tensors, hf
        offsets: list[int] = entry["data_offsets"]  # type: ignore[assignment]
        begin, end = offsets
        words = np.frombuffer(raw[start + begin:start + end], dtype="<u2")
        found = tensors[gg]
        if len(entry["shape"]) == 2:  # type: ignore[arg-type]
            assert found.tensor_type.name == "BF16"
            assert found.data.tobytes() == words.tobytes(), hf  # bf16 as it was stored
        else:
            assert found.tensor_type.name == "F32"
            widened = (words.astype(np.uint32) << np.uint32(16)).view(np.float32)
            assert np.array_equal(np.asarray(found.data).ravel(), widened), hf
    assert len(tensors) == len(entries) - 1
    fields = reader.fields
    assert fields["general.architecture"].contents() == "qwen3"
    assert fields["qwen3.block_count"].contents() == 4
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    tiny_gguf = GGUFReader(str(tiny.parent / "tiny.gguf")).fields
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.ggml.eos_token_id", "tokenizer.chat_template",
                "qwen3.attention.head_count_kv", "qwen3.rope.freq_base"):
        assert fields[key].contents() == tiny_gguf[key].contents(), key


def test_a_config_only_directory_gets_random_weights_of_its_shape(tmp_path: Path) -> None:
    model = write_shaped_config(tmp_path / "small", "tiny")
    made = gguf_make.from_hf(model, tmp_path / "random.gguf")
    reader = GGUFReader(str(made))
    dims = gguf_make.Dims.of(json.loads((model / "config.json").read_text()), "tiny")
    assert len(reader.tensors) == len(dims.shapes())
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    k = next(t for t in reader.tensors if t.name == "blk.0.attn_k.weight")
    assert q.tensor_type.name == "F16" and 0.015 < float(np.std(q.data)) < 0.025
    assert not np.array_equal(np.asarray(q.data)[:128], np.asarray(k.data))  # not one copy
    assert reader.fields["general.name"].contents() == "kvlab-random-small"


def test_a_write_that_fails_leaves_no_gguf(tiny: Path, tmp_path: Path) -> None:
    dims = gguf_make.Dims.of(json.loads((tiny / "config.json").read_text()), "m")
    planned = gguf_make.plan_of(dims.shapes(), "F16")

    def cut() -> Iterator[tuple[str, gguf_make.Array]]:
        yield planned[0].name, np.zeros(planned[0].shape, dtype=np.float16)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gguf_make.write(tmp_path / "cut.gguf", dims, Tokenizer.of(tiny, dims.vocab), "cut",
                        planned, cut)
    assert list(tmp_path.iterdir()) == []
