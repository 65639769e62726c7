"""`kvlab reuse` (the seed's measure-reuse.py), `kvlab prove`, `kvlab check`.

Exit codes: 0 when every verdict is what it should be; 1 when `reuse` or `prove` found no
reuse where reuse was expected (`silent-miss`, `warm-up-only`: the record is written and the
result printed first); 2 for a user error, and for `check` refusing instances that disagree
(with `--json`, its one document is printed first, `"compatible": false` and each mismatch).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core.errors import InputError, RefusedError
from kvlab.measure.conversation import PREAMBLE_WORDS, TURN_MAX_TOKENS
from kvlab.measure.verdict import FAILED
from kvlab.records.models import LAB_OFFLOAD

CONNECTORS = click.Choice(["shared", "nixl", "mooncake", "lmcache", "none"])
base_url_option = click.option(
    "--base-url", "urls", multiple=True,
    help="OpenAI-compatible base URL (…/v1); give twice to alternate between two engines.")
ignore_option = click.option(
    "--ignore", multiple=True,
    help="A compatibility field not to compare (repeatable), e.g. fingerprint or kv_store.")


def _api_key(name: str) -> str:
    return os.environ.get(name, "") if name else ""


@click.command("reuse")
@base_url_option
@click.option("--model", help="Model name the server reports (default: SERVED_NAME).")
@click.option("--turns", type=int, default=6, show_default=True)
@click.option("--preamble-words", type=click.IntRange(min=1), default=PREAMBLE_WORDS,
              show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=TURN_MAX_TOKENS,
              show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True)
@click.option("--label", default="reuse", show_default=True)
@click.option("--api-key-env", help="Variable holding the API key (default: LOADTEST_API_KEY_ENV).")
@click.option("--labbook", help="Notebook to append to (default: LABBOOK).")
@click.option("--lab", default=LAB_OFFLOAD, show_default=True)
@click.option("--note", default="")
@click.option("--connector", type=CONNECTORS, help="What links two endpoints (default: CONNECTOR).")
@ignore_option
@click.option("--print-only", is_flag=True, help="Print the result, record nothing.")
@json_option
@click.pass_context
def reuse_command(ctx: click.Context, urls: tuple[str, ...], model: str | None, turns: int,
                  preamble_words: int, max_tokens: int, temperature: float, timeout: float,
                  label: str, api_key_env: str | None, labbook: str | None, lab: str,
                  note: str, connector: str | None, ignore: tuple[str, ...], print_only: bool,
                  as_json: bool) -> None:
    """Time a growing conversation turn by turn and read the engines' reuse counters."""
    from kvlab.measure import compat
    from kvlab.measure.reuse import ReuseOptions, reuse_record, run_reuse
    from kvlab.records import notebook

    if turns < 2:
        raise InputError("--turns must be at least 2; the point is the comparison between them")
    settings = settings_from(ctx, labbook=labbook).values
    targets = list(urls) or ["http://127.0.0.1:8000/v1"]
    out = Output(as_json)
    opts = ReuseOptions(
        urls=targets, model=model or settings.served_name, turns=turns,
        preamble_words=preamble_words, max_tokens=max_tokens, temperature=temperature,
        timeout_s=timeout, api_key=_api_key(api_key_env or settings.loadtest_api_key_env),
        connector=connector or settings.connector,
    )
    out.note(f"==> {label}: {opts.model}, {turns} turns, preamble about {preamble_words} "
             f"words, max_tokens {max_tokens}")
    if len(targets) > 1:
        asyncio.run(compat.check(targets, ignore=ignore))
        out.note("    instances agree (kvlab check); turns alternate between them")
    run = asyncio.run(run_reuse(opts, say=out.note))
    record = reuse_record(run, label, lab, note)
    if not print_only:
        notebook.append(settings.labbook, record)
    out.result(record, lambda c: _render_reuse(c, record.line(), print_only, settings.labbook))
    failed = [f"turn {r.turn}" for r in run.rows if r.verdict in FAILED]
    if failed:
        out.err.print(f"kvlab: no reuse where reuse was expected ({', '.join(failed)}): exit 1")
        ctx.exit(1)


def _render_reuse(console: Console, record: dict[str, Any], print_only: bool,
                  labbook: str) -> None:
    s = record["summary"]
    if s["turn1_ttft_s"] and s["best_later_ttft_s"]:
        console.print(f"\n    turn 1 time to first token   {s['turn1_ttft_s']:.3f} s")
        console.print(f"    fastest later turn           {s['best_later_ttft_s']:.3f} s "
                      f"({s['best_later_ratio']:.2f}x of turn 1)")
    for url, deltas in record["metric_deltas"].items():
        hits, queries = deltas.get("prefix_cache_hits"), deltas.get("prefix_cache_queries")
        if hits is not None and queries:
            console.print(f"    {url}: prefix cache {hits:.0f} hit tokens of {queries:.0f} "
                          f"queried, {hits / queries * 100:.1f}%")
        if deltas.get("external_prefix_cache_hits"):
            console.print(f"    {url}: external (connector) hits "
                          f"{deltas['external_prefix_cache_hits']:.0f} tokens")
    reused, later = s["reused_turns"], len(s["later_turn_verdicts"])
    if reused == later:
        console.print(f"    every later turn reused the conversation so far ({reused}/{later})")
    elif reused == 0:
        console.print("    NO later turn reused anything: every turn was prefilled from scratch")
    else:
        console.print(f"    {reused} of {later} later turns reused; see each turn's verdict")
    for reasons in record["turn_reasons"]:
        for reason in reasons:
            if "ExampleConnector" in reason:
                console.print(f"    note: {reason}")
                break
        else:
            continue
        break
    console.print("\n    --print-only: nothing written." if print_only else
                  f"\n    Appended one reuse line to {labbook}")


@click.command("prove")
@base_url_option
@click.option("--model", help="Model name the server reports (default: SERVED_NAME).")
@click.option("--preamble-words", type=click.IntRange(min=1), default=600, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0)
@click.option("--salt", is_flag=True, help="Also test cache_salt isolation (vLLM).")
@click.option("--connector", type=CONNECTORS, help="What links two endpoints (default: CONNECTOR).")
@click.option("--label", default="prove", show_default=True)
@click.option("--api-key-env", help="Variable holding the API key (default: LOADTEST_API_KEY_ENV).")
@click.option("--labbook", help="Notebook to append to (default: LABBOOK).")
@click.option("--lab", default=LAB_OFFLOAD, show_default=True)
@click.option("--note", default="")
@ignore_option
@click.option("--print-only", is_flag=True, help="Print the result, record nothing.")
@json_option
@click.pass_context
def prove_command(ctx: click.Context, urls: tuple[str, ...], model: str | None,
                  preamble_words: int, max_tokens: int, timeout: float, salt: bool,
                  connector: str | None, label: str, api_key_env: str | None,
                  labbook: str | None, lab: str, note: str, ignore: tuple[str, ...],
                  print_only: bool, as_json: bool) -> None:
    """Prove reuse with a cold request, an identical repeat and a changed-prefix control."""
    from kvlab.measure.prove import ProveOptions, proof_record, prove
    from kvlab.records import notebook

    settings = settings_from(ctx, labbook=labbook).values
    targets = list(urls) or ["http://127.0.0.1:8000/v1"]
    if len(targets) > 2:
        raise InputError("--base-url: prove takes one endpoint, or two sharing a store")
    out = Output(as_json)
    opts = ProveOptions(
        urls=targets, model=model or settings.served_name, preamble_words=preamble_words,
        max_tokens=max_tokens, timeout_s=timeout, salt=salt, ignore=ignore,
        api_key=_api_key(api_key_env or settings.loadtest_api_key_env),
        connector=connector or settings.connector, settings=settings,
    )
    out.note(f"==> proving reuse on {', '.join(targets)}")
    run = asyncio.run(prove(opts, say=out.note))
    record = proof_record(run, label, lab, note)
    if not print_only:
        notebook.append(settings.labbook, record)
    _render_proof(out, record)
    if run.failed():
        out.err.print("kvlab: no reuse where reuse was expected ("
                      + ", ".join(run.failed()) + "): exit 1")
        ctx.exit(1)


def _render_proof(out: Output, record: Any) -> None:

    def human(console: Console) -> None:
        table = Table("case", "verdict", "expected", "observed", "TTFT x cold", box=None)
        for case in record.cases:
            ev = case.get("evidence", {})
            table.add_row(case["case"], str(case["verdict"] or "-"),
                          str(ev.get("expected_tokens", "")),
                          str(ev.get("observed_tokens", "")), str(ev.get("ttft_ratio", "")))
        console.print(table)
        for case in record.cases:
            if case["verdict"] not in (None, "reused", "no-reuse-expected"):
                console.print(f"  {case['case']}: " + "; ".join(case["reasons"]))
        for line in record.explanations:
            console.print(f"  {line}")

    out.result(record, human)


@click.command("check")
@click.argument("urls", nargs=-1, required=True)
@ignore_option
@json_option
def check_command(urls: tuple[str, ...], ignore: tuple[str, ...], as_json: bool) -> None:
    """Refuse instances that disagree: model, version, context, block size, chat-template
    tokens, model content, dtype, quantisation, KV type, numerics flags, store, and the
    behavioural fingerprint (the same probe's top-k logprobs). A different model path is a
    note. Exit 2 when refused; --json prints its document either way."""
    from kvlab.measure import compat
    from kvlab.observe import fingerprint

    if len(urls) < 2:
        raise InputError("check needs at least two URLs to compare")
    unknown = sorted(set(ignore) - set(compat.FIELDS))
    if unknown:
        raise InputError(f"--ignore {unknown[0]}: not a compared field; choose from "
                         + ", ".join(compat.FIELDS))
    result = asyncio.run(compat.compare(list(urls), ignore=ignore))
    facts = result.instances

    def human(console: Console) -> None:
        table = Table("field", *[f.url for f in facts], box=None)
        for name in (*compat.COMPARED, *compat.COMPARED_WHERE_KNOWN, *compat.NOTED):
            table.add_row(name, *[str(getattr(f.as_record(), name)) for f in facts])
        table.add_row(compat.FINGERPRINT, *[
            " ".join(repr(t) for t in (f.fingerprint.as_record().chosen if f.fingerprint
                                        else [])) or "no logprobs" for f in facts])
        console.print(table)
        for line in result.notes:
            console.print(f"note: {line}")
        for mismatch in result.mismatches:
            console.print(f"MISMATCH: {mismatch.message()}")
        if result.compatible:
            console.print("compatible: every compared field agrees, and so do the numbers "
                          f"(fingerprint within {fingerprint.TOLERANCE:.0e})")

    Output(as_json).result(result.as_dict(), human)
    if not result.compatible:
        raise RefusedError(result.refusal())


COMMANDS = (reuse_command, prove_command, check_command)
