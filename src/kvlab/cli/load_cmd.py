"""`kvlab load`, `kvlab run-load LABEL URL`, `kvlab compare`: the P/D lab's measurement chain.

`load` takes exactly what the seed's run-load.sh passes to Part 9's load-test.py (plus kvlab's
own options) and writes one notebook row per concurrency level; its workloads are the prompt
sets (shared-prefix optionally in prefix groups), user sessions (`--users`) and trace replay
(`--trace`), at concurrencies or open-loop rates; `--find-capacity` searches the load for the
highest that meets a latency target and writes a `capacity` line; `run-load` is run-load.sh
(byte counters around a load run, one `link` line); `compare` is compare-disagg.py plus
kvlab's checks. Each parses, makes one library call, renders. Ctrl-C during a load stops it
cleanly: in-flight requests are recorded as cancelled, measured levels are kept, exit 130.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.core.errors import InputError, SettingError
from kvlab.core.settings import POINT_TO_POINT, LoadedSettings, Settings
from kvlab.engines.base import ALIASES as ENGINE_ALIASES
from kvlab.engines.base import NAMES as ENGINE_NAMES
from kvlab.engines.base import VLLM, canonical_name
from kvlab.records.evidence import Percentiles, Where
from kvlab.records.load import BoundFigure, LinkRecord, LoadRecord, RunContext

if TYPE_CHECKING:
    from kvlab.loadgen.sweep import SweepResult

T = TypeVar("T")
ENGINES = (*ENGINE_NAMES, *ENGINE_ALIASES)  # the seed's load-test.py says llamacpp
PROGRESS_REDRAWS_PER_S = 2
TRACE_IN_FLIGHT = 256  # a trace's in-flight cap unless CONCURRENCY is set


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


@contextmanager
def level_progress(out: Output, enabled: bool) -> Iterator[Any]:
    """A rich progress bar per level on stderr (hook for the sweep), or None.

    Drawing runs on rich's thread and holds the GIL while it renders, which delays the
    event loop's timestamps: measured with `benchmarks/loadgen_accuracy.py --progress`, the
    default 10 redraws a second (1.4 ms each) added 0.2 ms to the timing error's p99 at
    200 req/s. Twice a second is enough for a bar.
    """
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn())
    with Progress(*columns, console=out.err, transient=False,
                  refresh_per_second=PROGRESS_REDRAWS_PER_S) as bar:
        def hook(level: int, total: int) -> Callable[[Any], None]:
            task = bar.add_task(f"concurrency {level}", total=total, failed=0)
            failed = [0]

            def tick(record: Any) -> None:
                # records are decoded after the level: count what is known now
                failed[0] += int(record.error is not None or record.status != 200)
                bar.update(task, advance=1, failed=failed[0])
            return tick
        yield hook


def _ms(value: float | None) -> str:
    return f"{value * 1000:.1f}" if value is not None else "-"


def render_rows(console: Console, rows: Sequence[LoadRecord]) -> None:
    from rich.table import Table

    table = Table("conc", "ok", "fail", "warm-up", "TTFT p50", "TTFT p95", "TTFT p99",
                  "TPOT p50", "ITL p50", "tok/s", "req/s", "hits", "lag p99",
                  title="times in ms; percentiles over the ok requests")
    none = Percentiles()
    for r in rows:
        ttft = r.ttft_s or none
        hits = r.prefix_hit_rate
        table.add_row(str(r.concurrency), str(r.ok), str((r.failed or 0) + (r.cancelled or 0)),
                      str(r.warmup_requests or 0), _ms(ttft.p50), _ms(ttft.p95), _ms(ttft.p99),
                      _ms((r.tpot_s or none).p50), _ms((r.itl_s or none).p50),
                      f"{r.output_tokens_per_s or 0:.0f}", f"{r.requests_per_s or 0:.1f}",
                      f"{hits:.0%}" if hits is not None else "-",
                      _ms((r.schedule_lag_s or none).p99))
    console.print(table)
    for r in rows:
        if r.errors:
            first = r.failures[0].detail if r.failures else ""
            console.print(f"    concurrency {r.concurrency}: failures {r.errors}; first: "
                          f"{first[:160]}")
        if r.goodput:
            g = r.goodput
            console.print(f"    concurrency {r.concurrency}: goodput "
                          f"{g.requests_per_s} req/s ({g.requests} met {g.slo})")


def split_topology(settings: Settings, base_url: str) -> Where:
    """What the URL and the settings honestly say about the machines behind `base_url`."""
    from kvlab.loadgen import topology

    known = topology.Known(
        connector=settings.connector, prefill_host=settings.prefill_host,
        decode_host=settings.decode_host, proxy_port=settings.proxy_port,
        cluster_iface=settings.cluster_iface,
        legs=topology.proxy_legs(base_url, settings.api_key()))
    return topology.derive(base_url, known)


def requests_setting(loaded: LoadedSettings) -> int | None:
    """REQUESTS when someone set it (flag, environment, .env, or a profile such as cpu-tiny's
    short CI sweeps); None when it is the seed's default, so each level takes enough requests
    that its p99 is not one request (`loadgen.sweep.default_requests`)."""
    return None if loaded.sources.get("requests") == "default" else loaded.values.requests


def _floats(option: str, text: str | None) -> tuple[float, ...]:
    if not text:
        return ()
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{option} {text!r}: give numbers separated by commas") from None
    if any(not v > 0 for v in values):
        raise InputError(f"{option} {text!r}: every value must be above 0")
    return values


def workload_fields(loaded: LoadedSettings, o: dict[str, Any]) -> dict[str, Any]:
    """The LoadSpec fields of the workload options: rates, prefix groups, user sessions
    (the levels become user counts), a trace (token prompts to /v1/completions)."""
    from kvlab.loadgen.sessions import SessionSpec, ThinkTime
    from kvlab.loadgen.trace import TraceSpec

    rates = _floats("--rate", o["rate"])
    out: dict[str, Any] = {"rate": rates[0] if len(rates) == 1 else None,
                           "rates": rates if len(rates) > 1 else (),
                           "groups": o["prefix_groups"],
                           "group_shares": _floats("--group-shares", o["group_shares"])}
    if o["users"]:
        out["levels"] = tuple(int(v) for v in _floats("--users", o["users"]))
        out["sessions"] = SessionSpec(turns=o["turns"], think=ThinkTime.parse(o["think_time"]),
                                      user_rate=o["user_rate"],
                                      cache_block_tokens=o["cache_block"])
    if o["trace"]:
        out["trace"] = TraceSpec(o["trace"], o["trace_block_size"], o["trace_speedup"],
                                 o["trace_limit"], o["trace_max_input"])
        out["endpoint"] = "completions"
        source = loaded.sources.get("concurrency", "default")
        if source == "default" or source.startswith("profile"):  # nobody asked for a cap
            out["levels"] = (TRACE_IN_FLIGHT,)
    return out


def load_spec(loaded: LoadedSettings, *, base_url: str, label: str, engine: str,
              options: dict[str, Any], lab: str, metrics_url: str = "") -> Any:
    """A LoadSpec from settings (SERVED_NAME, CONCURRENCY, ...) and the command's options
    (`generator_options`' values by name)."""
    from kvlab.loadgen.capacity import is_target
    from kvlab.loadgen.stats import Slo
    from kvlab.loadgen.sweep import LoadSpec

    settings, o = loaded.values, options
    if is_target(o["slo"]) and not o.get("find_capacity"):
        raise InputError(f"--slo {o['slo']!r}: a latency target (<=) is for --find-capacity; "
                         "goodput bounds are written ttft_ms=500,tpot_ms=50")
    context = RunContext(context_length=settings.ctx, memory_fraction=settings.mem_fraction,
                         kv_cache_type=o["kv_cache_type"] or None)
    context.overlay(split_topology(settings, base_url))
    fields: dict[str, Any] = dict(
        base_url=base_url, model=settings.served_name, levels=tuple(settings.concurrency),
        requests=requests_setting(loaded), max_tokens=settings.max_tokens,
        prompt_set=settings.prompt_set, label=label, engine=canonical_name(engine),
        endpoint=o["endpoint"], timeout_s=o["timeout"],
        poisson=o["arrivals"] == "poisson",
        slo=Slo.parse(o["slo"]) if o["slo"] and not is_target(o["slo"]) else None,
        preamble_tokens=o["preamble_tokens"] or settings.preamble_tokens, seed=o["seed"],
        ignore_eos=o["ignore_eos"], scrape_metrics=not o["no_metrics"],
        metrics_url=metrics_url, lab=lab, context=context, min_requests=o["min_requests"],
        duration_s=o["duration"], warmup=o["warmup"], labbook=settings.labbook,
        size_prompts=o["prompt_sizing"] == "tokenizer", tokenize_url=o["tokenize_url"])
    return LoadSpec(**{**fields, **workload_fields(loaded, o)})


def generator_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """kvlab's own load options, shared by `load` and `run-load`."""
    options = [
        click.option("--slo", help="Goodput bounds, e.g. ttft_ms=500,tpot_ms=50 (e2e_ms too); "
                                   "with --find-capacity the target, e.g. "
                                   "'ttft_p90<=0.5,tpot_p90<=0.05' (seconds; errors<=0.01)."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0,
                     show_default=True, help="Seconds one request may take; then it failed."),
        click.option("--rate", help="Open loop: requests per second, capped at the "
                                    "concurrency; several (1,2,4) sweep them, one level each."),
        click.option("--arrivals", type=click.Choice(["poisson", "even"]), default="poisson",
                     show_default=True, help="Open-loop arrival gaps (even: a constant rate)."),
        click.option("--users", help="User sessions: users per level, e.g. 4,8 (they replace "
                                     "--concurrency and the prompt set)."),
        click.option("--turns", type=click.IntRange(min=1), default=4, show_default=True,
                     help="User sessions: turns per conversation."),
        click.option("--think-time", default="exponential:1", show_default=True,
                     help="User sessions: seconds between a reply and the next turn: fixed:S, "
                          "exponential:S (mean), trace:FILE (one value a line) or paced:N (about "
                          "N users in flight, from the warm-up's request time)."),
        click.option("--user-rate", type=click.FloatRange(min=0, min_open=True),
                     help="User sessions: new users a second (Poisson), each for one "
                          "conversation [default: all users there from the start]."),
        click.option("--cache-block", type=click.IntRange(min=1),
                     help="User sessions: the cache's block in tokens, for counting turns that "
                          "came back after eviction [default: read from the cached counts]."),
        click.option("--prefix-groups", type=click.IntRange(min=1), default=1,
                     show_default=True, help="shared-prefix: how many preambles."),
        click.option("--group-shares", help="shared-prefix: each group's share of the "
                                            "requests, e.g. 0.5,0.3,0.2 [default: equal]."),
        click.option("--trace", type=click.Path(dir_okay=False),
                     help="Replay a Mooncake-format trace (JSON lines: timestamp ms, "
                          "input_length, output_length, hash_ids) as token prompts to "
                          "/v1/completions."),
        click.option("--trace-block-size", type=click.IntRange(min=1), default=512,
                     show_default=True, help="Tokens per hash id in the trace."),
        click.option("--trace-speedup", type=click.FloatRange(min=0, min_open=True),
                     default=1.0, show_default=True, help="Replay this many times faster."),
        click.option("--trace-limit", type=click.IntRange(min=1),
                     help="Replay the first N requests only."),
        click.option("--trace-max-input", type=click.IntRange(min=1),
                     help="Leave out requests with longer prompts (counted in the row)."),
        click.option("--preamble-tokens", type=click.IntRange(min=1),
                     help="Preamble size, approximate tokens (default: PREAMBLE_TOKENS)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Workload seed."),
        click.option("--endpoint", type=click.Choice(["chat", "completions"]), default="chat",
                     show_default=True, help="/v1/chat/completions or /v1/completions."),
        click.option("--ignore-eos", is_flag=True, help="Ask for exactly --max-tokens tokens."),
        click.option("--kv-cache-type", help="Record the server's KV type (f16, q8_0, ...)."),
        click.option("--no-metrics", is_flag=True, help="Do not scrape the server's /metrics."),
        click.option("--no-progress", is_flag=True, help="No progress bars."),
        click.option("--warmup", type=click.IntRange(min=0),
                     help="Requests sent first at each level and left out of every statistic "
                          "(marked in the per-request file) [default: one per concurrent "
                          "request]."),
        click.option("--min-requests", type=click.IntRange(min=1),
                     help="Measured requests per level at least [default: REQUESTS when set, "
                          "else max(10 x concurrency, 200)]."),
        click.option("--duration", type=click.FloatRange(min=0, min_open=True),
                     help="Seconds each level runs at least (and at least --min-requests)."),
        click.option("--prompt-sizing", type=click.Choice(["tokenizer", "estimate"]),
                     default="tokenizer", show_default=True,
                     help="Size prompts in the served model's tokens through its /tokenize, "
                          "or by the 1.3-tokens-a-word estimate (also the fallback when the "
                          "server has no /tokenize)."),
        click.option("--tokenize-url", default="",
                     help="The engine whose /tokenize sizes the prompts [default: the base "
                          "URL's server, then --metrics-url's; behind a proxy, an engine]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.command("load")
@click.option("--base-url", help="The server's OpenAI base URL, e.g. http://127.0.0.1:8200/v1.")
@click.option("--model", help='Name sent in "model" (default: SERVED_NAME).')
@click.option("--concurrency", help="Levels, e.g. 1,4,8 (default: CONCURRENCY).")
@click.option("--requests", type=int,
              help="Measured requests per level (default: REQUESTS when set, else max(10 x "
                   "concurrency, 200)).")
@click.option("--max-tokens", type=int, help="Output tokens per request (default: MAX_TOKENS).")
@click.option("--prompt-set", help="shared-prefix, mixed or multi-turn (default: PROMPT_SET).")
@click.option("--label", default="load", show_default=True, help="Label of the rows.")
@click.option("--engine", type=click.Choice(ENGINES), default="vllm", show_default=True)
@click.option("--labbook", help="Notebook file (default: LABBOOK).")
@click.option("--lab", type=click.Choice(["pd", "offload"]), default="pd", show_default=True,
              help="Which lab the rows belong to.")
@click.option("--metrics-url", default="",
              help="The engine's /metrics for the counter deltas (default: the URL's server; "
                   "behind a proxy, give the decode engine's).")
@generator_options
@click.option("--find-capacity", is_flag=True,
              help="Search the load for the highest that meets --slo's target (one row per "
                   "probe, labelled LABEL-capacity, then one capacity line).")
@click.option("--capacity-knob", type=click.Choice(["rate", "concurrency", "users", "speedup"]),
              help="What the search raises [default: users with --users, speedup with "
                   "--trace, else the open-loop rate].")
@click.option("--capacity-start", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="The first load tried.")
@click.option("--capacity-max", type=click.FloatRange(min=0, min_open=True),
              help="The highest load tried.")
@click.option("--capacity-steps", type=click.IntRange(min=1), default=8, show_default=True,
              help="Probes at most.")
@click.option("--capacity-resolution", type=click.FloatRange(min=0, min_open=True),
              default=0.1, show_default=True,
              help="Stop when the loads that met and missed are this close (share of the "
                   "load that met; whole numbers: one apart).")
@click.option("--capacity-repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Measure a probe again, up to this many times, while its interval "
                   "straddles a bound.")
@click.option("--print-load-test-path", is_flag=True,
              help="Print a file that works as LOAD_TEST for the seed's run-load.sh, and exit.")
@json_option
@click.pass_context
def load_command(ctx: click.Context, /, base_url: str | None, model: str | None,
                 concurrency: str | None, requests: int | None, max_tokens: int | None,
                 prompt_set: str | None, label: str, engine: str, labbook: str | None, lab: str,
                 metrics_url: str, print_load_test_path: bool, as_json: bool,
                 **options: Any) -> None:
    """Stream requests at each concurrency level; one notebook row and one per-request file
    (beside the notebook, in kvlab-requests/) per level."""
    from kvlab.loadgen.load_test_entry import write_launcher
    from kvlab.loadgen.sweep import run_sweep
    from kvlab.records import notebook

    out = Output(as_json)
    loaded = settings_from(ctx, served_name=model, concurrency=concurrency, requests=requests,
                           max_tokens=max_tokens, prompt_set=prompt_set, labbook=labbook)
    settings = loaded.values
    if print_load_test_path:
        path = write_launcher(settings.home(), sys.executable)
        out.result({"load_test": str(path)}, lambda c: c.print(str(path)))
        return
    if not base_url:
        raise InputError("--base-url is required, e.g. --base-url http://127.0.0.1:8200/v1")
    spec = load_spec(loaded, base_url=base_url, label=label, engine=engine, options=options,
                     lab=notebook.LAB_PD if lab == "pd" else notebook.LAB_OFFLOAD,
                     metrics_url=metrics_url)
    if options["find_capacity"]:
        _find_capacity(out, spec, options, settings)
        return
    with level_progress(out, not options["no_progress"]) as hook:
        result = run_interruptible(out, lambda stop: run_sweep(
            spec, api_key=settings.api_key(), stop=stop, progress=hook,
            on_row=lambda row: notebook.append(settings.labbook, row)))

    def human(console: Console) -> None:
        render_rows(console, result.rows)
        console.print(f"    Appended {len(result.rows)} load line(s) to {settings.labbook}; "
                      "each level's requests in "
                      + ", ".join(str(r.requests_file) for r in result.rows))

    out.result({"rows": result.rows, "labbook": settings.labbook,
                "interrupted": result.interrupted}, human)
    if result.interrupted:
        sys.exit(130)


def _find_capacity(out: Output, spec: Any, o: dict[str, Any], settings: Any) -> None:
    """`--find-capacity`: the search, its rows and its capacity line, rendered."""
    from kvlab.loadgen.capacity import Knob, SearchPlan, Target, check_knob, search
    from kvlab.records import notebook

    if not o["slo"]:
        raise InputError("--find-capacity needs --slo with the target, e.g. "
                         "--slo 'ttft_p90<=0.5,tpot_p90<=0.05'")
    target = Target.parse(o["slo"])
    knob = Knob.of(o["capacity_knob"] or ("users" if spec.sessions else "speedup"
                                          if spec.trace else "rate"))
    check_knob(knob, spec)
    plan = SearchPlan(start=o["capacity_start"], max_load=o["capacity_max"],
                      max_steps=o["capacity_steps"], resolution=o["capacity_resolution"],
                      repeats=o["capacity_repeats"], duration_s=o["duration"] or 15.0,
                      min_requests=o["min_requests"] or 20,
                      warmup=2 if o["warmup"] is None else o["warmup"])
    book = settings.labbook
    result = run_interruptible(out, lambda stop: search(
        spec, target, knob, plan, api_key=settings.api_key(), stop=stop,
        on_row=lambda row: notebook.append(book, row), say=out.note))
    notebook.append(book, result.record)

    def human(console: Console) -> None:
        from rich.table import Table

        bounds = result.record.target.bounds
        table = Table(knob.name, "met", *bounds, "failed", "why",
                      title=f"capacity search: {target.text()} (percentiles in seconds, "
                            "95% intervals)")
        for step in result.record.steps:
            cells = [_figure(step.figures.get(k)) for k in bounds]
            table.add_row(f"{step.load:g}", "yes" if step.met else "no", *cells,
                          f"{step.failed_share:.1%}", step.why)
        console.print(table)
        console.print(f"==> capacity: {result.record.statement}")
        console.print(f"    Appended {len(result.rows)} probe row(s) and one capacity line to "
                      f"{book}")

    out.result({"capacity": result.record, "rows": result.rows, "labbook": book}, human)


def _figure(f: BoundFigure | None) -> str:
    if f is None or f.value is None:
        return "-"
    band = f" [{f.low:.3g}, {f.high:.3g}]" if f.low is not None and f.high is not None else ""
    return f"{f.value:.3g}{band}"


def _link_lines(console: Console, record: LinkRecord, labbook: str) -> None:
    if record.rx_bytes is not None:
        console.print(f"==> Link during this run, on {record.iface}")
        console.print(f"    received     {record.rx_bytes} bytes")
        console.print(f"    transmitted  {record.tx_bytes} bytes")
    else:
        console.print("==> No byte counters recorded. Set CLUSTER_IFACE to measure the link.")
    rdma = record.rdma
    if rdma:
        console.print(f"    RDMA ports   received {rdma.rx_bytes}, transmitted "
                      f"{rdma.tx_bytes} bytes" + (" (a counter saturated)"
                                                  if rdma.saturated else ""))
    for url, nixl in (record.nixl or {}).items():
        console.print(f"    NIXL         {nixl.nixl_bytes or 0:.0f} bytes in "
                      f"{nixl.nixl_transfers or 0:.0f} transfers ({url})")
    if record.side_channel and record.side_channel.verdict:
        console.print(f"    side channel {record.side_channel.verdict}")
    console.print("    Per request, compare the larger figure with one request's KV cache "
                  "(kvlab predict); a thousand times smaller means no cache crossed.")
    console.print(f"    Appended one link line to {labbook}")


def _topology_line(where: Where) -> str:
    hosts = ", ".join(f"{role} {host}" for role, host in (where.hosts or {}).items())
    return (f"{where.topology} ({hosts}); connector {where.connector}; "
            f"link {where.link}; from {where.topology_from}")


@click.command("run-load")
@click.argument("label")
@click.argument("base_url")
@click.option("--metrics-url", "metrics_urls", multiple=True,
              help="An engine's /metrics to read around the run (repeatable; default: the "
                   "URL's own server). Give the decode engine's to see NIXL bytes.")
@click.option("--repeat", type=click.IntRange(1), default=1, show_default=True,
              help="Run the sweep this many times, each on prompts of its own and with its "
                   "own link line; rows carry the repeat, and compare's intervals pool them.")
@generator_options
@json_option
@click.pass_context
def run_load_command(ctx: click.Context, /, label: str, base_url: str,
                     metrics_urls: tuple[str, ...], repeat: int, as_json: bool,
                     **options: Any) -> None:
    """The seed's run-load.sh: a load run with the link's byte counters around it."""
    from kvlab.loadgen.linkrun import LinkSpec, check_load_test, run_load
    from kvlab.records import notebook

    out = Output(as_json)
    loaded = settings_from(ctx)
    settings = loaded.values
    spec = load_spec(loaded, base_url=base_url, label=label, engine=VLLM, options=options,
                     lab=notebook.LAB_PD, metrics_url=metrics_urls[0] if metrics_urls else "")
    if settings.load_test:
        check_load_test(settings.load_test)
    link = LinkSpec(connector=settings.connector, context_length=settings.ctx,
                    iface=settings.cluster_iface, load_test=settings.load_test,
                    metrics_urls=metrics_urls,
                    side_channel_addr=settings.side_channel_addr
                    if settings.connector in POINT_TO_POINT else "",
                    where=Where.part_of(spec.context))
    out.note(f"==> {label} against {base_url}")
    out.note(f"    topology: {_topology_line(spec.context)}")
    out.note(f"    reading byte counters on {settings.cluster_iface}" if settings.cluster_iface
             else "    no interface counters (CLUSTER_IFACE unset)")
    from kvlab.experiments.repeats import one_side

    if repeat > 1 and settings.load_test:
        raise SettingError("--repeat: LOAD_TEST's script numbers no repeats; leave LOAD_TEST "
                           "empty to repeat with kvlab's generator")
    if repeat > 1:  # the repeats of one invocation: compare pools them by this id
        spec = replace(spec, run_id=time.strftime("%Y%m%d-%H%M%S"))
    results = []
    for number in one_side(repeat):
        if number is not None:
            out.note(f"==> {label}: repeat {number + 1} of {repeat}")
        this = replace(spec, repeat=number)
        with level_progress(out, not options["no_progress"] and not settings.load_test) as hook:
            record, sweep = run_interruptible(out, lambda stop: run_load(
                this, link, settings.labbook,  # noqa: B023 (called before the loop goes on)
                lambda line: notebook.append(settings.labbook, line),
                api_key=settings.api_key(), stop=stop, progress=hook))
        results.append((record, sweep))
        if sweep is not None and sweep.interrupted:
            break
    _run_load_result(out, results, settings.labbook)


def _run_load_result(out: Output, results: list[tuple[LinkRecord, SweepResult | None]],
                     labbook: str) -> None:
    """Print each repeat's rows and link lines; exit 130 when interrupted, 1 when every
    request failed."""
    rows = [row for _, sweep in results if sweep is not None for row in sweep.rows]

    def human(console: Console) -> None:
        for record, sweep in results:
            if sweep is not None:
                render_rows(console, sweep.rows)
            _link_lines(console, record, labbook)

    last = results[-1][1]
    out.result({"link": results[-1][0], "links": [r for r, _ in results], "rows": rows,
                "labbook": labbook}, human)
    if last is not None and last.interrupted:
        sys.exit(130)
    if rows and not any(r.ok for r in rows):
        out.err.print("kvlab: every request failed (see the failures above)")
        sys.exit(1)


@click.command("compare")
@click.option("--labbook", help="Notebook to read and append to (default: LABBOOK).")
@click.option("--disagg", help="Label of the disaggregated run [default: disagg].")
@click.option("--baseline", help="Label of the single-machine run [default: baseline].")
@click.option("--kv-bytes-per-token", type=click.IntRange(min=0), default=0,
              help="KV bytes per token, e.g. 147456 for Qwen3-8B at bf16.")
@click.option("--model-config", type=click.Path(path_type=Path),
              help="config.json, model directory or .gguf to compute bytes per token from.")
@click.option("--kv-dtype", help="KV dtype for --model-config (default: the model's).")
@click.option("--prompt-tokens", type=click.IntRange(min=0), default=0,
              help="Prompt length for the prediction (default: the server's usage counts).")
@click.option("--note", default="", help="Free text: topology, connector, link.")
@click.option("--lab", help="Lab name written in the record.")
@click.option("--offload", is_flag=True,
              help="Pair offload-on-load against offload-off-load and state the pressure.")
@click.option("--print-only", is_flag=True, help="Print the comparison, write nothing.")
@json_option
@click.pass_context
def compare_command(ctx: click.Context, labbook: str | None, disagg: str | None,
                    baseline: str | None, kv_bytes_per_token: int, model_config: Path | None,
                    kv_dtype: str | None, prompt_tokens: int, note: str, lab: str | None,
                    offload: bool, print_only: bool, as_json: bool) -> None:
    """The seed's compare-disagg.py, plus same-experiment checks and bytes three ways."""
    from kvlab.measure import compare, kvmath
    from kvlab.records import notebook

    out = Output(as_json)
    settings = settings_from(ctx, labbook=labbook).values
    if kv_bytes_per_token and model_config:
        raise InputError("give --kv-bytes-per-token or --model-config, not both")
    per_token = float(kv_bytes_per_token) or (
        kvmath.load_shape(model_config).bytes_per_token(kv_dtype) if model_config else None)
    records = compare.read_records(settings.labbook)
    result = compare.compare(
        records, settings.labbook,
        disagg or (compare.OFFLOAD_ON if offload else "disagg"),
        baseline or (compare.OFFLOAD_OFF if offload else "baseline"),
        kv_bytes_per_token=per_token, prompt_tokens=float(prompt_tokens) or None, note=note,
        lab=lab or (notebook.LAB_OFFLOAD if offload else notebook.LAB_PD), offload=offload)
    if not print_only:
        notebook.append(settings.labbook, result.record)

    def human(console: Console) -> None:
        for line in result.lines:
            console.print(line)
        console.print("\n    --print-only: nothing written." if print_only
                      else f"\n    Appended one comparison line to {settings.labbook}")

    out.result({"comparison": result.record, "lines": result.lines, "written": not print_only},
               human)


COMMANDS: list[click.Command] = [load_command, run_load_command, compare_command]
