"""GGUFs for llama-server, written with the `gguf` package: from an HF model directory (its
safetensors weights, bf16, f16 or f32, streamed one tensor at a time, so an 8B model never
sits whole in memory), from a config-only directory (`kvlab models shaped`: random weights
of its shape, made tensor by tensor), and the tiny generated model's (`models.py`).

What it writes is a Qwen3 decoder (Qwen3ForCausalLM, the shapes kvlab's labs use) with its
tokenizer.json's byte-level BPE (`gguf_tokens.py`): the tensors under llama.cpp's names
(`GGUF_NAMES`), each checked against the shape config.json gives it; 2-D weights keep their
type, 1-D ones (norms) are f32, as llama.cpp reads them. Anything else is refused with the
setting that replaces it (LLAMA_MODEL, a GGUF made by llama.cpp's own converter).

Each file is written under a temporary name beside its place and renamed: a cut run never
leaves half a GGUF. The GGUF kvlab makes from MODEL, and where it keeps it, is
`llamacpp/model_gguf.py`'s.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.core import InputError
from kvlab.engines.gguf_tokens import Tokenizer

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Array = NDArray[np.generic]

VERSION = 1  # of the bytes written here: a GGUF kept from an older one is made again
ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3"}  # HF's class -> llama.cpp's architecture
RANDOM_WEIGHTS = "random weights: timing and caching are real, text is not"
# HF's name inside a layer -> llama.cpp's (`blk.N.` + it)
GGUF_NAMES = (
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
)
OUTSIDE = (("model.embed_tokens.weight", "token_embd.weight"),
           ("model.norm.weight", "output_norm.weight"), ("lm_head.weight", "output.weight"))
IGNORED = ("rotary_emb.inv_freq",)  # buffers some checkpoints carry, recomputed at load
ELEMENT = {"BF16": 2, "F16": 2, "F32": 4}  # safetensors' dtypes kvlab reads, bytes each
POOL = 1 << 24  # random weights' values (32 MiB of f16), laid out anew in every matrix


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp's name for an HF tensor name (None: none kvlab knows)."""
    for hf, gg in OUTSIDE:
        if hf_name == hf:
            return gg
    prefix, _, rest = hf_name.partition(".layers.")
    if prefix != "model" or "." not in rest:
        return None
    layer, _, inner = rest.partition(".")
    found = dict(GGUF_NAMES).get(inner)
    return f"blk.{layer}.{found}" if found is not None and layer.isdigit() else None


@dataclass(frozen=True)
class Dims:
    """A Qwen3 decoder's dimensions and numbers, as config.json states them."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rms_eps: float
    rope_theta: float
    tied: bool

    @classmethod
    def of(cls, config: dict[str, object], source: str) -> Dims:
        arch = config.get("architectures")
        names = arch if isinstance(arch, list) else []
        if not any(n in ARCHITECTURES for n in names):
            raise InputError(f"{source}: architecture {names or 'unknown'}; kvlab writes GGUFs "
                             f"of {', '.join(ARCHITECTURES)} only: set LLAMA_MODEL to a GGUF "
                             "(llama.cpp's convert_hf_to_gguf.py makes one)")

        def number(key: str, default: float | None = None) -> float:
            value = config.get(key, default)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise InputError(f"{source}: {key!r} is missing or not a positive number")
            return float(value)

        heads = int(number("num_attention_heads"))
        hidden = int(number("hidden_size"))
        return cls(int(number("num_hidden_layers")), hidden, int(number("intermediate_size")),
                   heads, int(number("num_key_value_heads", heads)),
                   int(number("head_dim", hidden // heads)), int(number("vocab_size")),
                   int(number("max_position_embeddings")), number("rms_norm_eps", 1e-6),
                   number("rope_theta", 10000.0), bool(config.get("tie_word_embeddings")))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's HF name and shape (rows, columns), in the order they are written."""
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        f = self.intermediate
        inner: dict[str, tuple[int, ...]] = {
            "input_layernorm.weight": (h,), "self_attn.q_proj.weight": (q, h),
            "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
            "self_attn.q_norm.weight": (self.head_dim,),
            "self_attn.k_norm.weight": (self.head_dim,), "self_attn.o_proj.weight": (h, q),
            "post_attention_layernorm.weight": (h,), "mlp.gate_proj.weight": (f, h),
            "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f)}
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab, h)}
        for i in range(self.layers):
            out |= {f"model.layers.{i}.{name}": shape for name, shape in inner.items()}
        out["model.norm.weight"] = (h,)
        if not self.tied:
            out["lm_head.weight"] = (self.vocab, h)
        return out


@dataclass(frozen=True)
class Stored:
    """One tensor of a safetensors file: where its bytes lie, its type and shape."""

    file: Path
    offset: int
    dtype: str
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, Stored]:
    """The tensors a safetensors file holds (its JSON header; no tensor is read)."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError) as exc:
        raise InputError(f"{path}: not a readable safetensors file ({exc})") from None
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, _ = entry["data_offsets"]
        out[name] = Stored(path, 8 + size + begin, entry["dtype"], tuple(entry["shape"]))
    return out


def checked(stored: dict[str, Stored], dims: Dims, source: str) -> dict[str, Stored]:
    """The weights llama.cpp needs, each of the shape and a type kvlab reads; InputError
    naming the first tensor that is missing, unknown, of another shape or type."""
    wanted = dims.shapes()
    for name, found in stored.items():
        if name.endswith(IGNORED) or (dims.tied and name == "lm_head.weight"):
            continue
        if name not in wanted:
            raise InputError(f"{source}: tensor {name} is not part of a {dims.layers}-layer "
                             "Qwen3 decoder kvlab can write (biases, adapters, experts?)")
        if found.shape != wanted[name]:
            raise InputError(f"{source}: tensor {name} has shape {list(found.shape)}, where "
                             f"config.json makes it {list(wanted[name])}")
        if found.dtype not in ELEMENT:
            raise InputError(f"{source}: tensor {name} is {found.dtype}; kvlab reads "
                             f"{', '.join(ELEMENT)} weights (a quantised checkpoint needs "
                             "llama.cpp's own converter: set LLAMA_MODEL)")
    missing = [n for n in wanted if n not in stored]
    if missing:
        raise InputError(f"{source}: no tensor {missing[0]} (of {len(missing)} missing)")
    return {name: stored[name] for name in wanted}


def read_json(path: Path) -> dict[str, object]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(found, dict):
        raise InputError(f"{path}: not a JSON object")
    return found


# --- writing ------------------------------------------------------------------------------

Tensors = Iterator[tuple[str, "Array"]]  # llama.cpp's name and the array, in header order


@dataclass(frozen=True)
class Planned:
    """One tensor to write: llama.cpp's name, its shape, its GGUF type, its bytes."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "F32", "F16" or "BF16"

    @property
    def nbytes(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count * ELEMENT[self.kind]


def write(path: Path, dims: Dims, tok: Tokenizer, name: str, planned: list[Planned],
          tensors: Callable[[], Tensors]) -> Path:
    """The GGUF at `path`: metadata, then each planned tensor as `tensors()` yields it (one
    at a time); written under a temporary name and renamed."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".partial-", suffix=".gguf")
    os.close(fd)
    w = gguf.GGUFWriter(tmp, arch=ARCHITECTURES["Qwen3ForCausalLM"])
    try:
        _metadata(w, dims, tok, name, planned)
        raw = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
               "BF16": gguf.GGMLQuantizationType.BF16}
        for t in planned:
            dtype = np.dtype({"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[t.kind])
            w.add_tensor_info(t.name, t.shape, dtype, t.nbytes, raw_dtype=raw[t.kind])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t, (gg, array) in zip(planned, tensors(), strict=True):
            if gg != t.name or array.nbytes != t.nbytes:
                raise InputError(f"{path}: tensor {gg} is not the {t.name} planned")
            w.write_tensor_data(array)
        w.close()
        Path(tmp).replace(path)
    except BaseException:
        w.close()
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _metadata(w: object, dims: Dims, tok: Tokenizer, name: str, planned: list[Planned]) -> None:
    import gguf

    assert isinstance(w, gguf.GGUFWriter)
    w.add_name(name)
    w.add_context_length(dims.context)
    w.add_embedding_length(dims.hidden)
    w.add_block_count(dims.layers)
    w.add_feed_forward_length(dims.intermediate)
    w.add_head_count(dims.heads)
    w.add_head_count_kv(dims.kv_heads)
    w.add_key_length(dims.head_dim)
    w.add_value_length(dims.head_dim)
    w.add_layer_norm_rms_eps(dims.rms_eps)
    w.add_rope_freq_base(dims.rope_theta)
    kinds = {t.kind for t in planned if len(t.shape) == 2}
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if kinds == {"BF16"}
                    else gguf.LlamaFileType.MOSTLY_F16 if kinds == {"F16"}
                    else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.types)
    w.add_token_merges(tok.merges)
    w.add_bos_token_id(tok.bos)
    w.add_eos_token_id(tok.eos)
    if tok.pad is not None:
        w.add_pad_token_id(tok.pad)
    w.add_add_bos_token(False)
    if tok.template:
        w.add_chat_template(tok.template)


def plan_of(shapes: dict[str, tuple[int, ...]], matrix_kind: str) -> list[Planned]:
    """The tensors to write, by llama.cpp's names: matrices as `matrix_kind`, vectors f32."""
    out = []
    for hf, shape in shapes.items():
        gg = gguf_name(hf)
        if gg is None:
            raise InputError(f"tensor {hf} has no llama.cpp name kvlab knows")
        out.append(Planned(gg, shape, matrix_kind if len(shape) == 2 else "F32"))
    return out


def from_arrays(path: Path, dims: Dims, tok: Tokenizer, name: str,
                weights: Mapping[str, Array]) -> Path:
    """A GGUF of weights held in memory (the tiny model): f16 matrices, f32 vectors."""
    import numpy as np

    shapes = {hf: tuple(weights[hf].shape) for hf in dims.shapes()}
    planned = plan_of(shapes, "F16")

    def tensors() -> Tensors:
        for t, hf in zip(planned, shapes, strict=True):
            yield t.name, weights[hf].astype(np.float16 if t.kind == "F16" else np.float32)

    return write(path, dims, tok, name, planned, tensors)


def from_hf(model_dir: Path, path: Path) -> Path:
    """The GGUF of an HF directory's safetensors weights, streamed (each tensor read from
    its file's pages as it is written); without weight files, random weights of its shape
    (`RANDOM_WEIGHTS`): f16 matrices from one seeded pool of N(0, 0.02) values, each from an
    offset of its own (fresh normals for every weight of the 8B shape took minutes), norms
    ones."""
    import numpy as np

    source = str(model_dir)
    dims = Dims.of(read_json(model_dir / "config.json"), f"{source}/config.json")
    tok = Tokenizer.of(model_dir, dims.vocab)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        shapes = dims.shapes()
        planned = plan_of(shapes, "F16")

        pool = (np.random.default_rng(0).standard_normal(POOL, dtype=np.float32)
                * np.float32(0.02)).astype(np.float16)

        def random() -> Tensors:
            for i, (t, shape) in enumerate(zip(planned, shapes.values(), strict=True)):
                if len(shape) == 1:
                    yield t.name, np.ones(shape, dtype=np.float32)
                else:  # the pool from an offset of the tensor's own, repeated to its size
                    yield t.name, np.resize(np.roll(pool, i * 104_729), shape)

        return write(path, dims, tok, f"kvlab-random-{model_dir.name}", planned, random)
    stored: dict[str, Stored] = {}
    for file in files:
        stored |= read_header(file)
    found = checked(stored, dims, source)
    kinds = {s.dtype for s in found.values() if len(s.shape) == 2}
    if len(kinds) != 1:
        raise InputError(f"{source}: its matrices mix {', '.join(sorted(kinds))}")
    planned = plan_of({n: s.shape for n, s in found.items()}, kinds.pop())

    def streamed() -> Tensors:
        for t, s in zip(planned, found.values(), strict=True):
            yield t.name, _array(s, t.kind)

    return write(path, dims, tok, model_dir.name, planned, streamed)


def _array(stored: Stored, kind: str) -> Array:
    """A stored tensor as the type it is written in, mapped from its file (BF16 as its raw
    16-bit words; a 1-D one widened to f32)."""
    import numpy as np

    count = 1
    for n in stored.shape:
        count *= n
    source = {"BF16": "<u2", "F16": "<f2", "F32": "<f4"}[stored.dtype]
    raw = np.memmap(stored.file, dtype=source, mode="r", offset=stored.offset,
                    shape=(count,)).reshape(stored.shape)
    if kind == stored.dtype:
        return raw
    if stored.dtype == "BF16":  # to f32: the 16 bits are f32's high half
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw.astype(np.float32 if kind == "F32" else np.float16)
