"""`kvlab load`, `kvlab run-load LABEL URL`, `kvlab compare`: the P/D lab's measurement chain.

`load` takes exactly what the seed's run-load.sh passes to Part 9's load-test.py (plus kvlab's
own options, `loadgen/args.py`) and writes one notebook row per concurrency level; its
workloads are the prompt sets (shared-prefix optionally in prefix groups), user sessions
(`--users`) and trace replay (`--trace`), at concurrencies or open-loop rates;
`--find-capacity` searches the load for the highest that meets a latency target and writes a
`capacity` line; `run-load` is run-load.sh (byte counters around a load run, one `link`
line); `compare` is compare-disagg.py plus kvlab's checks. Each parses, makes one library call
(`experiments/manual.py`), renders. Ctrl-C during a load stops it cleanly: in-flight requests
are recorded as cancelled, measured levels are kept, exit 130.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, server_settings, settings_from
from kvlab.cli.options import SpreadCommand, arguments
from kvlab.core import EXIT_ALL_FAILED, EXIT_CODES, EXIT_INTERRUPTED, EXIT_NOT_CONVERGED, InputError
from kvlab.engines import VLLM
from kvlab.experiments.manual_args import CompareArgs
from kvlab.loadgen import (
    BenchArgs,
    CapacityArgs,
    LoadArgs,
    TargetArgs,
    lab_named,
    load_spec,
    openai_key,
    understood_url,
)

if TYPE_CHECKING:
    from kvlab.core import Settings
    from kvlab.loadgen import LoadSpec
    from kvlab.records import LoadRecord

T = TypeVar("T")


def run_interruptible(out: Output, body: Callable[[asyncio.Event], Awaitable[T]]) -> T:
    """Run `body(stop)` on uvloop; the first Ctrl-C sets `stop`, a second one cancels."""
    import uvloop

    async def main() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_sigint() -> None:
            if stop.is_set() and task is not None:
                task.cancel()
                return
            stop.set()
            out.err.print("kvlab: stopping; in-flight requests are recorded as cancelled "
                          "(Ctrl-C again to abandon)")

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await body(stop)
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return uvloop.run(main())


def finish(out: Output, rows: list[LoadRecord], interrupted: bool) -> None:
    """Exit as `EXIT_CODES` says: interrupted, or every measured request failed."""
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if rows and not any(r.ok for r in rows):
        out.err.print("kvlab: every request failed (see the failures above)")
        sys.exit(EXIT_ALL_FAILED)


@click.command("load", cls=SpreadCommand, epilog=EXIT_CODES)
@arguments(TargetArgs, "target")
@arguments(LoadArgs, "load")
@arguments(BenchArgs, "bench")
@arguments(CapacityArgs, "search")
@json_option
@click.pass_context
def load_command(ctx: click.Context, /, target: TargetArgs, load: LoadArgs, bench: BenchArgs,
                 search: CapacityArgs, as_json: bool) -> None:
    """Stream requests at each concurrency level; one notebook row and one per-request file
    (beside the notebook, in kvlab-requests/) per level."""
    from kvlab.experiments import manual
    from kvlab.loadgen import write_launcher
    from kvlab.report import console_load

    out = Output(as_json)
    target = target.read_backend(out.note)
    book = {"labbook": str(Path(bench.output_dir) / "labbook.md")} \
        if bench.output_dir and not target.labbook else {}
    loaded, key_from = openai_key(server_settings(ctx, **{**target.overrides(), **book}))
    settings, bench = loaded.values, bench.into_output_dir()
    if target.print_load_test_path:
        path = write_launcher(settings.home(), sys.executable)
        out.result({"load_test": str(path)}, lambda c: c.print(str(path)))
        return
    if not target.base_url:
        raise InputError("--base-url is required, e.g. --base-url http://127.0.0.1:8200/v1")
    base_url, understood = understood_url(target.base_url)
    for words in (understood, key_from):
        if words:
            out.note(f"    {words}")
    spec = load_spec(loaded, load, base_url=base_url, label=target.label,
                     engine=target.engine, lab=lab_named(target.lab),
                     metrics_urls=target.metrics_url, find_capacity=search.find_capacity,
                     bench=bench, say=out.note)
    spec = run_interruptible(out, lambda _: manual.served_spec(settings, spec, out.note))
    if search.find_capacity:
        _find_capacity(out, settings, spec, load, search)
        return
    out.note(console_load.load_plan(spec, loaded.profile, loaded.profile_reason))
    with console_load.progress(out.err, not load.no_progress) as hook:
        result = run_interruptible(out, lambda stop: manual.load(settings, spec, stop=stop,
                                                                 progress=hook))

    def human(c: Console) -> None:
        console_load.load_rows(c, result.rows)
        c.print(f"    Appended {len(result.rows)} load line(s) to {settings.labbook}; each "
                "level's requests in " + ", ".join(str(r.requests_file) for r in result.rows))

    out.result({"rows": result.rows, "labbook": settings.labbook,
                "interrupted": result.interrupted}, human)
    if bench.output_dir and result.rows:
        from kvlab.report import write

        folder = Path(bench.output_dir)
        write(settings.labbook, folder, csv_dir=folder / "csv")
        out.note(f"    the report, its tables as CSV and the result documents in {folder}")
    finish(out, result.rows, result.interrupted)


def _find_capacity(out: Output, settings: Settings, spec: LoadSpec, load: LoadArgs,
                   search: CapacityArgs) -> None:
    """`--find-capacity`: the search, its rows and its capacity line, rendered."""
    from kvlab.experiments import manual
    from kvlab.report import console_load

    target, knob, plan = search.search(load, spec)
    found = run_interruptible(out, lambda stop: manual.capacity(
        settings, spec, target, knob, plan, stop=stop, say=out.note))

    def human(c: Console) -> None:
        console_load.capacity(c, found.record, target.text())
        c.print(f"    Appended {len(found.rows)} probe row(s) and one capacity line to "
                f"{settings.labbook}")

    out.result({"capacity": found.record, "rows": found.rows, "labbook": settings.labbook},
               human)
    finish(out, found.rows, any(r.interrupted for r in found.rows))
    if found.record.verdict in ("not-converged", "at-least"):
        out.err.print(f"kvlab: the search did not converge: {found.record.statement}")
        sys.exit(EXIT_NOT_CONVERGED)


@click.command("run-load", epilog=EXIT_CODES)
@click.argument("label")
@click.argument("base_url")
@click.option("--metrics-url", "metrics_urls", multiple=True,
              help="An engine's /metrics to read around the run (repeatable: the link line "
                   "reads each, the rows the first; default: the URL's own server). Give the "
                   "decode engine's first to see NIXL bytes on the rows.")
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True,
              help="Run the sweep this many times, each on prompts of its own and with its "
                   "own link line; rows carry the repeat, and compare's intervals pool them.")
@arguments(LoadArgs, "load")
@json_option
@click.pass_context
def run_load_command(ctx: click.Context, /, label: str, base_url: str,
                     metrics_urls: tuple[str, ...], repeat: int, load: LoadArgs,
                     as_json: bool) -> None:
    """The seed's run-load.sh: a load run with the link's byte counters around it."""
    from kvlab.experiments import manual
    from kvlab.loadgen import link_spec
    from kvlab.report import console_load

    out = Output(as_json)
    loaded = server_settings(ctx)
    settings = loaded.values
    base_url, understood = understood_url(base_url)
    if understood:
        out.note(f"    {understood}")
    spec = load_spec(loaded, load, base_url=base_url, label=label, engine=VLLM,
                     lab=lab_named("pd"), metrics_urls=metrics_urls[:1],
                     say=out.note)
    link = link_spec(settings, spec, metrics_urls)
    if not link.load_test:  # LOAD_TEST's script names its own model
        spec = run_interruptible(out, lambda _: manual.served_spec(settings, spec, out.note))
    out.note(f"==> {label} against {base_url}")
    out.note(f"    topology: {console_load.topology(spec.context)}")
    out.note(f"    reading byte counters on {settings.cluster_iface}" if settings.cluster_iface
             else "    no interface counters (CLUSTER_IFACE unset)")
    with console_load.progress(out.err, not load.no_progress and not settings.load_test) as hook:
        results = run_interruptible(out, lambda stop: manual.run_load(
            settings, spec, link, repeat, stop=stop, progress=hook))
    rows = [row for _, sweep in results if sweep is not None for row in sweep.rows]

    def human(c: Console) -> None:
        for record, sweep in results:
            if sweep is not None:
                console_load.load_rows(c, sweep.rows)
            console_load.link(c, record, settings.labbook)

    out.result({"link": results[-1][0], "links": [r for r, _ in results], "rows": rows,
                "labbook": settings.labbook}, human)
    last = results[-1][1]
    finish(out, rows, last is not None and last.interrupted)


@click.command("compare")
@arguments(CompareArgs)
@json_option
@click.pass_context
def compare_command(ctx: click.Context, args: CompareArgs, as_json: bool) -> None:
    """The seed's compare-disagg.py, plus same-experiment checks and bytes three ways."""
    from kvlab.experiments import manual

    out = Output(as_json)
    settings = settings_from(ctx, labbook=args.labbook).values
    result = manual.compare(settings, args.pair(), args.noted())

    def human(c: Console) -> None:
        for line in result.lines:
            c.print(line)
        c.print(f"\n    Appended one comparison line to {settings.labbook}"
                if not args.print_only else "\n    --print-only: nothing written.")

    out.result({"comparison": result.record, "lines": result.lines,
                "written": not args.print_only}, human)


COMMANDS: list[click.Command] = [load_command, run_load_command, compare_command]
