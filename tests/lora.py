"""A LoRA adapter for the tiny Qwen3 model, in PEFT's layout (adapter_config.json and
adapter_model.safetensors), with random weights in both factors so that it changes what the
model computes (PEFT starts B at zero, which would leave the base's numbers unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

RANK = 8


def write_adapter(model_dir: str, out: Path, seed: int = 5, scale: float = 0.5) -> Path:
    """An adapter on q_proj and v_proj of every layer of the model at `model_dir`."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads, head_dim = config["num_key_value_heads"], config["head_dim"]
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for proj, width in (("q_proj", heads * head_dim), ("v_proj", kv_heads * head_dim)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = (
                rng.standard_normal((RANK, hidden)) * scale).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (
                rng.standard_normal((width, RANK)) * scale).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": model_dir, "fan_in_fan_out": False,
        "modules_to_save": None, "use_rslora": False, "use_dora": False}))
    return out
