"""`kvlab run offload|shared|disagg|all`: the vLLM experiments, and every experiment at once.

Each subcommand builds the experiment's spec from options and settings, runs it (engines
started from their plans and always stopped, temporary stores always removed), and prints
what it recorded. `--dry-run` prints every plan and starts nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, prepared_settings
from kvlab.cli.run_cmd import run_group
from kvlab.core.settings import Settings


def _lab(settings: Settings, out: Output) -> Any:
    from kvlab.experiments.lab import Lab

    return Lab(settings, say=out.note)


def _prepared(ctx: click.Context, out: Output) -> Settings:
    return prepared_settings(ctx, out.err).values


@run_group.command("offload")
@click.option("--turns", type=click.IntRange(2), default=6, show_default=True)
@click.option("--preamble-words", type=click.IntRange(1), help="Default: PREAMBLE_WORDS.")
@click.option("--concurrency", type=click.IntRange(1), default=8, show_default=True,
              help="Concurrency of the pressure runs (the lab uses 8).")
@click.option("--min-requests", type=click.IntRange(0), default=0,
              help="At least this many requests per pressure run.")
@click.option("--part", type=click.Choice(["all", "quiet", "pressure"]), default="all",
              show_default=True, help="Run only the quiet pair or only the pressure pair.")
@click.option("--dry-run", is_flag=True, help="Print the plans and start nothing.")
@json_option
@click.pass_context
def offload(ctx: click.Context, turns: int, preamble_words: int | None, concurrency: int,
            min_requests: int, part: str, dry_run: bool, as_json: bool) -> None:
    """The host-memory tier: off and on, quiet and under found pressure."""
    from kvlab.experiments import offload as experiment

    out = Output(as_json)
    settings = _prepared(ctx, out)
    spec = experiment.OffloadSpec(turns=turns,
                                  preamble_words=preamble_words or settings.preamble_words,
                                  concurrency=concurrency, min_requests=min_requests, part=part,
                                  load_max_tokens=settings.max_tokens,
                                  preamble_tokens=settings.preamble_tokens)
    lab = _lab(settings, out)
    if dry_run:
        plans = experiment.dry_run(lab, spec)
        out.result({"dry_run": True, "plans": plans}, lambda c: _render_plans(c, plans))
        return
    lines = asyncio.run(experiment.run_offload(lab, spec))
    out.result({"records": lines}, lambda c: _render_lines(c, lines, settings.labbook))


@run_group.command("shared")
@click.option("--turns", type=click.IntRange(2), default=6, show_default=True)
@click.option("--preamble-words", type=click.IntRange(1), help="Default: PREAMBLE_WORDS.")
@click.option("--dry-run", is_flag=True, help="Print the plans and start nothing.")
@json_option
@click.pass_context
def shared(ctx: click.Context, turns: int, preamble_words: int | None, dry_run: bool,
           as_json: bool) -> None:
    """Two instances, one KV store: alternating turns, a single-instance control, the proof."""
    from kvlab.experiments import shared as experiment

    out = Output(as_json)
    settings = _prepared(ctx, out)
    spec = experiment.SharedSpec(turns=turns,
                                 preamble_words=preamble_words or settings.preamble_words)
    lab = _lab(settings, out)
    if dry_run:
        plans = experiment.dry_run(lab)
        out.result({"dry_run": True, "plans": plans}, lambda c: _render_plans(c, plans))
        return
    lines = asyncio.run(experiment.run_shared(lab, spec))
    out.result({"records": lines}, lambda c: _render_lines(c, lines, settings.labbook))


@run_group.command("disagg")
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True),
              help="Link speed for the prediction (default: none on loopback).")
@click.option("--dry-run", is_flag=True, help="Print the plans and start nothing.")
@json_option
@click.pass_context
def disagg(ctx: click.Context, link_gbps: float | None, dry_run: bool, as_json: bool) -> None:
    """Prediction, the split behind kvlab's proxy, the baseline, the comparison."""
    from kvlab.experiments import disagg as experiment

    out = Output(as_json)
    s = _prepared(ctx, out)
    lab = _lab(s, out)
    if dry_run:
        plans = experiment.dry_run(lab)
        out.result({"dry_run": True, "plans": plans}, lambda c: _render_plans(c, plans))
        return
    spec = experiment.DisaggSpec(levels=s.concurrency, requests=s.requests,
                                 max_tokens=s.max_tokens, preamble_tokens=s.preamble_tokens,
                                 prompt_set=s.prompt_set, link_gbps=link_gbps)
    lines = asyncio.run(experiment.run_disagg(lab, spec))
    out.result({"records": lines}, lambda c: _render_lines(c, lines, s.labbook))


@run_group.command("all")
@click.option("--quick", is_flag=True, help="Small sizes: a first look, and CI.")
@click.option("--only", multiple=True,
              type=click.Choice(["disk", "interference", "offload", "shared", "disagg"]),
              help="Run just these experiments (repeatable).")
@click.option("--report-dir", type=click.Path(file_okay=False), default="kvlab-report",
              show_default=True, help="Where the report and its plots go.")
@json_option
@click.pass_context
def run_all_command(ctx: click.Context, quick: bool, only: tuple[str, ...], report_dir: str,
                    as_json: bool) -> None:
    """Every experiment this machine can run, then `kvlab report` (the README's main command)."""
    from pathlib import Path

    from kvlab.core.errors import KvlabError
    from kvlab.experiments.everything import Sizes, run_all
    from kvlab.report import build

    out = Output(as_json)
    loaded = prepared_settings(ctx, out.err)
    s = loaded.values
    sizes = Sizes.quick() if quick else Sizes.lab(s.concurrency, s.requests, s.max_tokens,
                                                  s.preamble_tokens, s.preamble_words)
    lab = _lab(s, out)
    out.note(f"==> kvlab run all (run {lab.run_id}, profile {loaded.profile}, notebook "
             f"{s.labbook})")
    done = asyncio.run(run_all(lab, sizes, only))
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
        console.print(f"==> {item['label']}")
        if "plan" in item:
            console.print(f"    {item['shell']}")
        else:
            console.print(f"    not run here: {item['reason']}")


def _render_lines(console: Console, lines: list[dict[str, Any]], labbook: str) -> None:
    for line in lines:
        console.print(f"  {line['record']:<10} {line['label']:<22} {summarise(line)}")
    console.print(f"{len(lines)} lines appended to {labbook}")


def summarise(line: dict[str, Any]) -> str:
    """One line of what a record says, for the end-of-run listing."""
    kind = line["record"]
    if kind == "not-run":
        return f"not run: {line['reason']}"
    if kind == "reuse":
        s = line.get("summary", {})
        return (f"turn 1 {s.get('turn1_ttft_s')} s, best later {s.get('best_later_ttft_s')} s, "
                f"reused turns {s.get('reused_turns')}/{len(s.get('later_turn_verdicts', []))}")
    if kind == "proof":
        return ", ".join(f"{k}={v}" for k, v in line["verdicts"].items() if v)
    if kind == "load":
        ttft = (line.get("ttft_s") or {}).get("p50")
        return (f"c={line.get('concurrency')} TTFT p50 {ttft} s, "
                f"{line.get('output_tokens_per_s')} tok/s, failed {line.get('failed', 0)}")
    return ""


COMMANDS: tuple[click.Command, ...] = ()  # the commands live on `run_group`
