"""`kvlab run EXPERIMENT`: one orchestrated experiment, its notebook lines, its result.

Each subcommand is one function below: parse options into the experiment's spec, make one
library call (which starts and always stops its own engines), append the lines, render.
Progress goes to stderr under `--json`, so stdout stays one JSON document.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, prepared_settings


@click.group("run")
def run_group() -> None:
    """Run one of the labs' experiments end to end and record it in the notebook."""


# ---- disk: llama.cpp's slot save/restore stopwatch --------------------------------------

@run_group.command("disk")
@click.option("--prompt-tokens", type=click.IntRange(16), default=3500, show_default=True,
              help="Length of the long prompt, in the model's tokens.")
@click.option("--ctx", "ctx_size", type=click.IntRange(256), default=8192, show_default=True,
              help="The experiment server's --ctx-size (a slot holds ctx/parallel).")
@click.option("--parallel", type=click.IntRange(1, 64), default=2, show_default=True,
              help="The experiment server's --parallel.")
@click.option("--cache-ram", "cache_ram", type=click.IntRange(-1), default=0, show_default=True,
              help="--cache-ram MiB; 0 keeps the RAM prompt cache from faking a restore.")
@click.option("--cache-type", help="KV type for -ctk/-ctv (default: LLAMA_CACHE_TYPE).")
@click.option("--label", default="disk", show_default=True, help="Notebook label.")
@click.option("--keep-file", is_flag=True, help="Keep the slot file and manifest in the store.")
@json_option
@click.pass_context
def disk(ctx: click.Context, prompt_tokens: int, ctx_size: int, parallel: int, cache_ram: int,
         cache_type: str | None, label: str, keep_file: bool, as_json: bool) -> None:
    """Time the disk tier: cold prefill, save, erase, control, restore, the prompt again.

    The server is the experiment's own (a free port, these settings, recorded in the line).
    """
    from kvlab.engines import llamacpp
    from kvlab.experiments.disk import DiskSpec, run_disk
    from kvlab.records import notebook

    out = Output(as_json)
    settings = prepared_settings(ctx, out.err, llama_cache_type=cache_type).values
    spec = DiskSpec(prompt_tokens=prompt_tokens, ctx=ctx_size, parallel=parallel,
                    cache_ram_mib=cache_ram, label=label, keep_file=keep_file)
    spec.check()
    binary = llamacpp.require_llama_server(settings)
    record = asyncio.run(run_disk(settings, binary, spec, say=out.note))
    notebook.append(settings.labbook, record)
    out.result(record, lambda console: _render_disk(console, record, settings.labbook))


def _render_disk(console: Console, r: dict[str, Any], labbook: str) -> None:
    ev = r["evidence"]
    console.print(f"==> The disk tier, timed ({r['prompt_tokens']} prompt tokens, "
                  f"{r['kv_cache_type']} KV, {r['model']})")
    console.print(f"    cold TTFT            {r['cold_ttft_s'] * 1000:10.1f} ms  "
                  f"(cache_n {ev['cold']['cache_n']})")
    console.print(f"    save                 {r['save_ms']:10.1f} ms  ({r['file_bytes']:,} bytes)")
    console.print(f"    control (no restore) {ev['control']['ttft_s'] * 1000:10.1f} ms  "
                  f"(cache_n {ev['control']['cache_n']})")
    console.print(f"    restore              {r['restore_ms']:10.1f} ms")
    console.print(f"    after restore TTFT   {r['post_restore_ttft_s'] * 1000:10.1f} ms  "
                  f"(cache_n {r['post_restore_cached_tokens']})")
    console.print(f"    restore / cold       {r['restore_cold_ratio']:10.5f}")
    console.print(f"    verdict: {r['verdict']}" + "".join(f"\n      - {x}" for x in r["reasons"]))
    if r.get("kv_note"):
        console.print(f"    note: {r['kv_note']}")
    console.print(f"    one `disk` line appended to {labbook}")


# ---- interference: Track M's reduced path (llama-server, --parallel 4 then 1) ------------

@run_group.command("interference")
@click.option("--concurrency", type=click.IntRange(1), default=4, show_default=True,
              help="Concurrent conversations (the lab uses 4).")
@click.option("--parallel", "parallels", default="4,1", show_default=True,
              help="The --parallel values to compare, the first as baseline.")
@click.option("--requests", type=click.IntRange(1), help="Requests per run (default: REQUESTS).")
@click.option("--ctx", "ctx_size", type=click.IntRange(256),
              help="--ctx-size for both runs (default: CTX).")
@click.option("--prompt-set", help="Prompt set (default: PROMPT_SET).")
@click.option("--label", default="interference", show_default=True,
              help="Label prefix: rows are LABEL-parallel-N.")
@json_option
@click.pass_context
def interference(ctx: click.Context, concurrency: int, parallels: str, requests: int | None,
                 ctx_size: int | None, prompt_set: str | None, label: str,
                 as_json: bool) -> None:
    """Prefill interference: the same load with --parallel 4, then 1 (one variable)."""
    from kvlab.core.errors import SettingError
    from kvlab.engines import llamacpp
    from kvlab.experiments.interference import InterferenceSpec, run_interference
    from kvlab.records import notebook

    out = Output(as_json)
    loaded = prepared_settings(ctx, out.err, requests=requests, prompt_set=prompt_set)
    settings = loaded.values
    if loaded.sources["prompt_set"] == "default":
        # a shared preamble lets one slot reuse it and hides the interference being measured
        settings = settings.model_copy(update={"prompt_set": "mixed"})
        out.note("prompt set: mixed (distinct prompts; set PROMPT_SET or --prompt-set to "
                 "override)")
    if ctx_size is not None:  # `ctx` is also the name of click's context argument
        settings = settings.model_copy(update={"ctx": ctx_size})
    try:
        values = tuple(int(p) for p in parallels.split(","))
    except ValueError:
        values = ()
    if len(values) < 2 or min(values) < 1:
        raise SettingError(f"--parallel {parallels!r}: give two or more slot counts, e.g. 4,1")
    spec = InterferenceSpec(concurrency=concurrency, parallels=values,
                            requests=settings.requests, max_tokens=settings.max_tokens,
                            prompt_set=settings.prompt_set, ctx=settings.ctx, label=label)
    spec.budget()
    binary = llamacpp.require_llama_server(settings)
    rows, comparison = asyncio.run(run_interference(settings, binary, spec, say=out.note))
    for line in [*rows, comparison]:
        notebook.append(settings.labbook, line)
    data = {"rows": rows, "comparison": comparison}
    out.result(data, lambda console: _render_interference(console, data, settings.labbook))


def _render_interference(console: Console, data: dict[str, Any], labbook: str) -> None:
    comp = data["comparison"]
    console.print(f"==> Prefill interference: {comp['model']}, {comp['prompt_set']}")
    console.print(f"    {'label':<28} {'TTFT p50':>10} {'TPOT p50':>10} {'out tok/s':>10} "
                  f"{'failed':>6}")
    for row in data["rows"]:
        ttft = (row.get("ttft_s") or {}).get("p50")
        tpot = (row.get("tpot_s") or {}).get("p50")
        console.print(f"    {row['label']:<28} {_ms(ttft):>10} {_ms(tpot):>10} "
                      f"{row.get('output_tokens_per_s', 0):>10.1f} {row.get('failed', 0):>6}")
    for level in comp["levels"]:
        console.print(f"    {level['candidate_label']} against {comp['baseline_label']}: TTFT "
                      f"x{level['ttft_p50_ratio']}, TPOT x{level['tpot_p50_ratio']}, "
                      f"throughput x{level['output_tokens_per_s_ratio']}")
    if not comp["same_experiment"]:
        console.print(f"    NOT the same experiment: {', '.join(comp['differs'])} differ")
    console.print(f"    {len(data['rows'])} load rows and one comparison appended to {labbook}")


# ---- shared-slots: one slot store, two llama-servers -------------------------------------

@run_group.command("shared-slots")
@click.option("--prompt-tokens", type=click.IntRange(16), default=2000, show_default=True,
              help="Length of the prompt, in the model's tokens.")
@click.option("--ctx", "ctx_size", type=click.IntRange(256), default=8192, show_default=True,
              help="Both servers' --ctx-size.")
@click.option("--parallel", type=click.IntRange(2, 64), default=2, show_default=True,
              help="Both servers' --parallel.")
@click.option("--cache-type", help="KV type for -ctk/-ctv (default: LLAMA_CACHE_TYPE).")
@click.option("--label", default="shared-store", show_default=True, help="Notebook label.")
@click.option("--keep-file", is_flag=True, help="Keep the slot file and manifest in the store.")
@json_option
@click.pass_context
def shared_slots(ctx: click.Context, prompt_tokens: int, ctx_size: int, parallel: int,
                 cache_type: str | None, label: str, keep_file: bool, as_json: bool) -> None:
    """Two llama-servers share one slot store: save on A, restore on B, prove reuse on B."""
    from kvlab.engines import llamacpp
    from kvlab.experiments.slot_share import SharedSlotsSpec, run_shared_slots
    from kvlab.records import notebook

    out = Output(as_json)
    settings = prepared_settings(ctx, out.err, llama_cache_type=cache_type).values
    spec = SharedSlotsSpec(prompt_tokens=prompt_tokens, ctx=ctx_size, parallel=parallel,
                           label=label, keep_file=keep_file)
    spec.check()
    binary = llamacpp.require_llama_server(settings)
    record = asyncio.run(run_shared_slots(settings, binary, spec, say=out.note))
    notebook.append(settings.labbook, record)
    out.result(record, lambda console: _render_shared(console, record, settings.labbook))


def _render_shared(console: Console, r: dict[str, Any], labbook: str) -> None:
    ev = r["evidence"]
    console.print(f"==> One slot store, two servers ({r['prompt_tokens']} prompt tokens)")
    for key, what in (("cold_a", "A, cold"), ("restored_b", "B, after restoring A's file"),
                      ("cold_b_control", "B, cold on another slot")):
        console.print(f"    {what:<30} TTFT {_ms(ev[key]['ttft_s']):>10}  "
                      f"cache_n {ev[key]['cache_n']}")
    console.print(f"    first-token logprobs, A cold vs B restored: max |diff| "
                  f"{ev['logprob_max_abs_diff']}")
    console.print(f"    verdict: {r['verdict']}" + "".join(f"\n      - {x}" for x in r["reasons"]))
    console.print(f"    one `reuse` line labelled {r['label']} appended to {labbook}")


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds is not None else "n/a"


COMMANDS = (run_group,)
