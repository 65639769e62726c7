"""What `kvlab load`, `kvlab run-load` and a capacity search print, for a person at a terminal.

The plan said before a load starts (its levels, counts, profile, the user's dataset), a
sweep's table with each level's failures, goodput, trace and cache oracle, the link's bytes
after `run-load`, the split's topology in one line, a capacity search's probes, and the
progress bar per level on stderr. A figure that was not recorded reads "-" or "n/a", never
"None".

It renders the load generator's records only: a run's listing is `console_run.py`'s, the
comparison of two sides (`kvlab compare`) is the CLI's own, and nothing here measures, reads
the notebook, or decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvlab.loadgen import Dataset, LoadSpec, ProgressHook, RequestRecord
from kvlab.measure import shortfall
from kvlab.records import (
    BoundFigure,
    CapacityRecord,
    LinkRecord,
    LoadRecord,
    TraceEvidence,
    Where,
)
from kvlab.report.common import ttft_account_words
from kvlab.report.console_common import NONE


def _ms(value: float | None) -> str:
    return f"{value * 1000:.1f}" if value is not None else "-"


def load_plan(spec: LoadSpec, profile: str, reason: str) -> str:
    """What a load will send, said before it starts: its levels and requests a level, output
    tokens, model, and the profile its defaults came from."""
    if spec.sessions is not None:
        kind = "users"
    elif spec.trace is not None:
        kind = "in-flight caps"
    else:
        kind = "concurrency"
    if spec.trace is not None:
        limit = spec.trace.limit
        counts = f"the trace's first {limit} requests" if limit else "every request of the trace"
    else:
        each = ", ".join(str(spec.floor(level)) for level, _ in spec.points())
        counts = f"at least {each} {'turns' if spec.sessions is not None else 'requests'} a level"
    return (f"==> {spec.label}: {kind} {', '.join(map(str, spec.levels))} ({counts}), "
            f"max_tokens {spec.max_tokens}, model {spec.model!r}; "
            f"defaults from profile {profile}" + (f" ({reason})" if reason else "")
            + (dataset_plan(spec.dataset) if spec.dataset is not None else ""))


def dataset_plan(data: Dataset) -> str:
    """The user's file as the plan says it: what is sent of it, and what was left out."""
    skipped = ", ".join(f"{n} {why}" for why, n in data.skipped.items())
    turns = (f"; its {data.conversations} conversations replayed as user sessions"
             if data.conversations else "")
    return (f"\n    dataset {data.file} ({data.format}, keys {', '.join(data.keys)}): "
            f"{len(data.entries)} of {data.records} records usable"
            + (f" (skipped: {skipped})" if skipped else "") + turns)


def load_rows(console: Console, rows: Sequence[LoadRecord]) -> None:
    """A sweep's levels: one table row each, then each level's failures and goodput."""
    table = Table("conc", "ok", "fail", "warm-up", "TTFT p50", "TTFT p95", "TTFT p99",
                  "TPOT p50", "ITL p50", "tok/s", "req/s", "hits", "lag p99",
                  title="times in ms; percentiles over the ok requests")
    for r in rows:
        ttft, hits = r.ttft_s or NONE, r.prefix_hit_rate
        table.add_row(str(r.concurrency), str(r.ok), str((r.failed or 0) + (r.cancelled or 0)),
                      str(r.warmup_requests or 0), _ms(ttft.p50), _ms(ttft.p95), _ms(ttft.p99),
                      _ms((r.tpot_s or NONE).p50), _ms((r.itl_s or NONE).p50),
                      f"{r.output_tokens_per_s or 0:.0f}", f"{r.requests_per_s or 0:.1f}",
                      f"{hits:.0%}" if hits is not None else "-",
                      _ms((r.schedule_lag_s or NONE).p99))
    console.print(table)
    for r in rows:
        if (t := r.trace) is not None:
            console.print(f"    concurrency {r.concurrency}: {trace_summary(t)}")
        if r.vllm_metrics:
            console.print(f"    concurrency {r.concurrency}: vllm bench's figures, ms: "
                          + ", ".join(f"{k.removesuffix('_ms')} {v:.2f}"
                                      for k, v in r.vllm_metrics.items()
                                      if not k.startswith("std_")))
        if r.result_file:
            console.print(f"    concurrency {r.concurrency}: vllm bench's result in "
                          f"{r.result_file}")
        if r.blank_outputs:
            console.print(f"    concurrency {r.concurrency}: {r.blank_outputs} answers counted "
                          "output tokens but decoded to no visible text (kept as successes, "
                          "timed from their first choice, as vllm bench does)")
        if r.client_processes:
            console.print(f"    concurrency {r.concurrency}: sent by {r.client_processes} "
                          "processes on one schedule (the client's CPU on the warm-up: "
                          f"{(r.client_cpu_per_request_s or 0) * 1e3:.2f} ms a request)")
        if r.cut_at_max_seconds:
            console.print(f"    concurrency {r.concurrency}: --max-seconds {r.max_seconds:g} "
                          f"reached: {r.requests} of {r.requests_planned} requests sent, the "
                          "rest not")
        if r.burst_reads:
            console.print(f"    concurrency {r.concurrency}: {r.burst_reads} answers reached the "
                          "client in one burst, faster than an engine decodes (a client that "
                          "fell behind, or an engine that sent them at once): their TPOT is the "
                          "client's, left out of comparisons")
        if r.errors:
            first = r.failures[0].detail if r.failures else ""
            console.print(f"    concurrency {r.concurrency}: failures {r.errors}; first: "
                          f"{first[:160]}")
        if (d := r.dataset) is not None:
            console.print(f"    concurrency {r.concurrency}: dataset {d.file}: {d.sent} records "
                          f"from record {d.first_record}" + (
                              f", {d.resent} sent before in this run (the file ran out)"
                              if d.resent else "") + (
                              f"; {d.outputs_capped} output lengths capped at max_tokens"
                              if d.outputs_capped else ""))
        if r.goodput:
            g = r.goodput
            console.print(f"    concurrency {r.concurrency}: goodput "
                          f"{g.requests_per_s} req/s ({g.requests} met {g.slo})")
        if r.replicas:
            _replicas(console, r)
        if r.ttft_account is not None:
            console.print(f"    concurrency {r.concurrency}: "
                          f"{ttft_account_words(r.ttft_account)}")
        if r.oracle_absent:
            console.print(f"    concurrency {r.concurrency}: {r.oracle_absent}")
        if (o := r.oracle) is not None and o.predicted_share is not None \
                and o.measured_share is not None:
            console.print(f"    concurrency {r.concurrency}: cache oracle {o.predicted_share:.1%}"
                          f" of prompt tokens cacheable, {o.measured_share:.1%} reported cached"
                          f" (a cache that never evicts: "
                          f"{o.infinite_cache_tokens / o.prompt_tokens:.1%})")
            if (words := shortfall(o)) is not None:
                console.print(f"    concurrency {r.concurrency}: {words}")


def _replicas(console: Console, r: LoadRecord) -> None:
    """Each replica's hits and share of the level, and the one far below the others."""
    parts: list[str] = []
    found = r.replicas or []
    unit = "requests" if all(c.requests is not None for c in found) else "prompt tokens"
    for c in found:
        hits = (f"{c.prefix_cache_hits / c.prefix_cache_queries:.0%} hits"
                if c.prefix_cache_queries and c.prefix_cache_hits is not None else "hits -")
        share = f"{c.share:.0%} of the {unit}" if c.share is not None else "share -"
        parts.append(f"{c.url.removesuffix('/metrics')} {hits}, {share}")
    console.print(f"    concurrency {r.concurrency}: replicas: " + "; ".join(parts))
    if r.replica_note:
        console.print(f"    concurrency {r.concurrency}: [bold]{r.replica_note}[/bold]")


def trace_summary(t: TraceEvidence) -> str:
    """What a trace replay sent: how many of its requests, and what became of the longer
    ones."""
    taken = f"the first {t.limit}" if t.limit else "all"
    words = f"trace {Path(t.path).name}: {t.requests} requests sent of {taken}"
    if t.max_input is not None:
        words += (f"; over {t.max_input} tokens: {t.truncated_to_max_input} truncated to fit"
                  if t.over_max_input == "truncate"
                  else f"; over {t.max_input} tokens: {t.left_out_over_max_input} left out")
    if t.reusable_fraction_infinite_cache is not None:
        words += (f"; an infinite cache would reuse {t.reusable_fraction_infinite_cache:.1%} "
                  "of what was sent")
    return words


def link(console: Console, record: LinkRecord, labbook: str) -> None:
    """run-load.sh's closing block: the bytes on the interface, RDMA, NIXL, the side channel."""
    if record.rx_bytes is not None:
        console.print(f"==> Link during this run, on {record.iface}")
        console.print(f"    received     {record.rx_bytes} bytes")
        console.print(f"    transmitted  {record.tx_bytes} bytes")
    else:
        console.print("==> No byte counters recorded. Set CLUSTER_IFACE to measure the link.")
    if record.rdma:
        console.print(f"    RDMA ports   received {record.rdma.rx_bytes}, transmitted "
                      f"{record.rdma.tx_bytes} bytes"
                      + (" (a counter saturated)" if record.rdma.saturated else ""))
    for url, nixl in (record.nixl or {}).items():
        console.print(f"    NIXL         {nixl.nixl_bytes or 0:.0f} bytes in "
                      f"{nixl.nixl_transfers or 0:.0f} transfers ({url})")
    if record.side_channel and record.side_channel.verdict:
        console.print(f"    side channel {record.side_channel.verdict}")
    console.print("    Per request, compare the larger figure with one request's KV cache "
                  "(kvlab predict); a thousand times smaller means no cache crossed.")
    console.print(f"    Appended one link line to {labbook}")


def topology(where: Where) -> str:
    """Where a run's split was, in one line."""
    hosts = ", ".join(f"{role} {host}" for role, host in (where.hosts or {}).items())
    return (f"{where.topology} ({hosts}); connector {where.connector}; "
            f"link {where.link}; from {where.topology_from}")


def capacity(console: Console, record: CapacityRecord, slo: str) -> None:
    """A capacity search: each probe's load, whether it met the target and why."""
    bounds = record.target.bounds
    table = Table(record.knob, "met", *bounds, "failed", "why",
                  title=f"capacity search: {slo} (percentiles in seconds, 95% intervals)")
    for step in record.steps:
        table.add_row(f"{step.load:g}", "yes" if step.met else "no",
                      *[_figure(step.figures.get(k)) for k in bounds],
                      f"{step.failed_share:.1%}", step.why)
    console.print(table)
    console.print(f"==> capacity: {record.statement}")


def _figure(f: BoundFigure | None) -> str:
    if f is None or f.value is None:
        return "-"
    band = f" [{f.low:.3g}, {f.high:.3g}]" if f.low is not None and f.high is not None else ""
    return f"{f.value:.3g}{band}"


# --- progress ------------------------------------------------------------------------------
PROGRESS_REDRAWS_PER_S = 2


@contextmanager
def progress(err: Console, enabled: bool) -> Iterator[ProgressHook | None]:
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
    with Progress(*columns, console=err, transient=False,
                  refresh_per_second=PROGRESS_REDRAWS_PER_S) as bar:
        def hook(level: int, total: int) -> Callable[[RequestRecord], None]:
            task = bar.add_task(f"concurrency {level}", total=total, failed=0)
            failed = [0]

            def tick(record: RequestRecord) -> None:
                # records are decoded after the level: count what is known now
                failed[0] += int(record.error is not None or record.status != 200)
                bar.update(task, advance=1, failed=failed[0])
            return tick
        yield hook
