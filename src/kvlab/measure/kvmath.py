"""KV-cache arithmetic: bytes per token, payload per request, transfer time, concurrency.

bytes/token = layers x KV heads x (key dim + value dim) x bytes per element, which for the
usual equal key and value dims is layers x KV heads x head dim x 2 x bytes per element.
Qwen3-8B at bf16: 36 x 8 x 128 x 2 x 2 = 147,456. Shapes come from an HF `config.json` or a
GGUF file's metadata. This module does arithmetic only: it never starts or asks an engine.
MLA, hybrid and sliding-window models do not follow the formula; `shape_from_hf_config`
refuses the ones it can recognise rather than print a wrong number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from kvlab.core import InputError
from kvlab.records import KvPrediction

# Bytes per stored element. llama.cpp's block-quantised types carry a scale per 32 values:
# q8_0 is 34 bytes per 32 values, q4_0 is 18 bytes per 32.
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0, "f32": 4.0, "float32": 4.0,
    "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "f16": 2.0, "float16": 2.0, "half": 2.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
    "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}


@dataclass(frozen=True)
class KvShape:
    """What the KV size depends on, read from a model's configuration."""

    source: str
    layers: int
    kv_heads: int
    key_dim: int
    value_dim: int
    dtype: str

    def bytes_per_token(self, dtype: str | None = None) -> float:
        """KV bytes one token occupies at `dtype` (default: the model's own)."""
        per = element_bytes(dtype or self.dtype)
        return self.layers * self.kv_heads * (self.key_dim + self.value_dim) * per

    def split_bytes_per_token(self, key_dtype: str, value_dtype: str) -> float:
        """KV bytes one token occupies with keys and values of two types (llama.cpp's -ctk,
        -ctv)."""
        return self.layers * self.kv_heads * (self.key_dim * element_bytes(key_dtype)
                                              + self.value_dim * element_bytes(value_dtype))


def element_bytes(dtype: str) -> float:
    """Bytes per element of a KV dtype name (bf16, fp8, q8_0, ...)."""
    try:
        return BYTES_PER_ELEMENT[dtype.lower()]
    except KeyError:
        known = ", ".join(sorted({"bf16", "fp16", "fp8", "fp32", "q8_0", "q4_0"}))
        raise InputError(f"KV dtype {dtype!r} is not known; use one of {known}") from None


def shape_from_hf_config(path: Path) -> KvShape:
    """Read layers, KV heads and head dim from an HF config.json (file or model directory)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{file}: no such file; give a config.json or a model directory") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{file}: not a readable JSON config ({exc})") from None
    return shape_from_config_dict(config, str(file))


class _HfConfig(BaseModel):
    """The fields of an HF config.json the arithmetic reads (the rest are ignored)."""

    model_config = ConfigDict(extra="ignore")

    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool = False
    num_experts: int | None = None
    num_local_experts: int | None = None
    text_config: _HfConfig | None = None


def shape_from_config_dict(config: dict[str, object], source: str) -> KvShape:
    """The same, from an already parsed config (nested `text_config` is followed)."""
    try:
        outer = _HfConfig.model_validate(config)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"])
        raise InputError(f"{source}: invalid field {where!r} for KV arithmetic") from None
    text = outer.text_config or outer
    if text.kv_lora_rank or text.q_lora_rank:
        raise InputError(f"{source}: MLA attention (kv_lora_rank) does not follow the formula")
    layers, heads = text.num_hidden_layers, text.num_attention_heads
    head_dim = text.head_dim or (text.hidden_size // heads if text.hidden_size and heads
                                 else None)
    if not layers or not heads or not head_dim:
        missing = ("num_hidden_layers" if not layers else "num_attention_heads" if not heads
                   else "hidden_size")
        raise InputError(f"{source}: missing or invalid field {missing!r} for KV arithmetic")
    dtype = text.torch_dtype or text.dtype or outer.torch_dtype or "bf16"
    return KvShape(source, layers, text.num_key_value_heads or heads, head_dim, head_dim, dtype)


def shape_from_gguf(path: Path) -> KvShape:
    """Read the KV shape from a GGUF file's metadata (`<arch>.block_count`, ...)."""
    from gguf import GGUFReader  # heavy: numpy memmap of the whole file

    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file")
    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise InputError(f"{path}: not a readable GGUF file ({exc})") from None

    def value(key: str) -> object:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    def number(key: str) -> int | None:
        found = value(f"{arch}.{key}")
        return int(found) if isinstance(found, int) and found > 0 else None

    arch = value("general.architecture")
    if not arch or not isinstance(arch, str):
        raise InputError(f"{path}: GGUF has no general.architecture")
    layers, heads = number("block_count"), number("attention.head_count")
    embd = number("embedding_length")
    if layers is None or heads is None or embd is None:
        raise InputError(f"{path}: GGUF lacks {arch}.block_count/head_count/embedding_length")
    kv_heads = number("attention.head_count_kv") or heads
    key_dim = number("attention.key_length") or embd // heads
    value_dim = number("attention.value_length") or embd // heads
    return KvShape(str(path), layers, kv_heads, key_dim, value_dim, "f16")


def load_shape(path: Path) -> KvShape:
    """A KV shape from a config.json, a model directory, or a .gguf file."""
    if path.suffix == ".gguf":
        return shape_from_gguf(path)
    return shape_from_hf_config(path)


def weight_bytes(model_dir: Path) -> int | None:
    """The model's weights in bytes: its weight files' sizes, or for a directory without them
    (random weights made at load) a dense decoder's parameters from config.json; None when
    neither says (no directory, a mixture of experts, fields missing)."""
    if not model_dir.is_dir():
        return None
    files = [*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")]
    if files:
        return sum(f.stat().st_size for f in files)
    dense = _dense(model_dir)
    if dense is None:
        return None
    attention = 2 * dense.hidden * dense.q_dim + 2 * dense.hidden * dense.kv_dim
    per_layer = attention + 3 * dense.hidden * dense.inner  # q, o, k, v; gate, up, down
    embeddings = dense.vocab * dense.hidden * (1 if dense.tied else 2)
    return int((dense.layers * per_layer + embeddings) * dense.element)


def activation_bytes_per_token(model_dir: Path) -> float | None:
    """The activations one token of a forward pass holds at its peak, in bytes, for a dense
    decoder (config.json): the MLP's gate and up projections and their product (3 x
    intermediate), the query and the attention's output (2 x heads x head dim), keys and
    values, the residual stream and its norm (2 x hidden), at the model's dtype. None where
    the config does not say (no directory, a mixture of experts, fields missing).

    A ceiling, not a measurement: the 8B shape gives 110,592 bytes a token, 6.75 GiB for
    65,536 tokens, where vLLM 0.26 measured a 6.53 GiB activation peak (`engines/vllm/
    facts.py`)."""
    dense = _dense(model_dir)
    if dense is None:
        return None
    width = 3 * dense.inner + 2 * dense.q_dim + 2 * dense.kv_dim + 2 * dense.hidden
    return width * dense.element


@dataclass(frozen=True)
class _Dense:
    """A dense decoder's dimensions, from its config.json."""

    hidden: int
    layers: int
    inner: int
    vocab: int
    q_dim: int  # heads x head dim
    kv_dim: int  # KV heads x head dim
    tied: bool
    element: float  # bytes per weight


def _dense(model_dir: Path) -> _Dense | None:
    try:
        config = _HfConfig.model_validate_json((model_dir / "config.json").read_bytes())
    except (OSError, ValidationError):
        return None
    c = config.text_config or config
    shape = (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,
             c.vocab_size)
    if c.num_experts or c.num_local_experts or not all(shape):
        return None
    hidden, layers, heads, inner, vocab = (int(v or 0) for v in shape)
    head_dim = c.head_dim or hidden // heads
    return _Dense(hidden, layers, inner, vocab, heads * head_dim,
                  (c.num_key_value_heads or heads) * head_dim, c.tie_word_embeddings,
                  element_bytes(c.torch_dtype or c.dtype or config.torch_dtype or "bf16"))


def round_up(tokens: int, block: int) -> int:
    """`tokens` rounded up to whole blocks of `block` tokens."""
    return math.ceil(tokens / block) * block if block > 0 else tokens


def transfer_seconds(payload_bytes: float, bytes_per_s: float) -> float:
    """Seconds to move `payload_bytes` over a link of `bytes_per_s`."""
    if bytes_per_s <= 0:
        raise InputError("link speed must be positive")
    return payload_bytes / bytes_per_s


def gbps_to_bytes_per_s(gbps: float) -> float:
    """Decimal gigabits per second to bytes per second (10 Gb/s = 1.25e9 B/s)."""
    return gbps * 1e9 / 8


def max_concurrency(cache_tokens: int, ctx: int) -> float:
    """How many full-context sequences a KV cache of `cache_tokens` holds at once."""
    return cache_tokens / ctx if ctx > 0 else 0.0


Prediction = KvPrediction  # what `kvlab predict` computes, as records state it


def predict(
    shape: KvShape,
    *,
    dtype: str | None = None,
    prompt_tokens: int | None = None,
    block_size: int = 16,
    link_bytes_per_s: float | None = None,
    kv_cache_tokens: int | None = None,
    kv_cache_bytes: float | None = None,
    ctx: int | None = None,
) -> Prediction:
    """Payload, transfer time and concurrency for one model shape and one workload."""
    kv_dtype = dtype or shape.dtype
    per_token = shape.bytes_per_token(kv_dtype)
    payload = aligned = t = t_aligned = None
    if prompt_tokens is not None:
        payload = per_token * prompt_tokens
        aligned = per_token * round_up(prompt_tokens, block_size)
        if link_bytes_per_s:
            t = transfer_seconds(payload, link_bytes_per_s)
            t_aligned = transfer_seconds(aligned, link_bytes_per_s)
    tokens = kv_cache_tokens
    if tokens is None and kv_cache_bytes is not None:
        tokens = int(kv_cache_bytes // per_token)
    conc = max_concurrency(tokens, ctx) if tokens is not None and ctx else None
    return Prediction(
        source=shape.source, layers=shape.layers, kv_heads=shape.kv_heads,
        head_dim=shape.key_dim, dtype=kv_dtype, bytes_per_token=per_token,
        prompt_tokens=prompt_tokens, block_size=block_size if prompt_tokens else None,
        payload_bytes=payload, payload_bytes_block_aligned=aligned,
        link_bytes_per_s=link_bytes_per_s, transfer_s=t, transfer_s_block_aligned=t_aligned,
        kv_cache_tokens=tokens, ctx=ctx, max_concurrency=conc,
        ttft_prediction=ttft_prediction(t) if t is not None else None,
    )


def ttft_prediction(transfer_s: float) -> str:
    """The P/D lab's TTFT prediction at concurrency 1, written before any run.

    With the same hardware on both sides, the split pays the same prefill plus the transfer
    and a proxy hop, so at concurrency 1 TTFT can only get worse, by about the transfer time;
    any gain must come from removing prefill/decode interference at higher concurrency.
    """
    return (
        f"worse at concurrency 1 by about {transfer_s:.3f} s (the transfer) plus a proxy hop;"
        " better only if interference at higher concurrency costs more than that"
    )
