"""What `kvlab run EXPERIMENT` prints of the lines it wrote, for a person at a terminal.

Every line a run wrote with a one-line summary each, the P/D procedure's steps and checks and
the boundary's points after them, a dry run's plans (a cluster's placement first), and the
N-replicas lab's arms per prompt set with its answer. A figure that was not recorded reads
"n/a", never "None".

The experiments with a renderer of their own are elsewhere: llama.cpp's disk tier, shared
slots and interference pair in `console_llama.py`; a served engine's plan in
`console_engines.py`. Nothing here measures, reads the notebook, or decides (the replicas'
answer is `replicas.py`'s).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from kvlab.cluster.placement import DryPlacement
from kvlab.records import (
    BoundaryRecord,
    CapacityRecord,
    ComparisonRecord,
    DiskRecord,
    LoadRecord,
    NotRunRecord,
    ProcedureRecord,
    ProofRecord,
    Record,
    ReuseRecord,
    ReuseSummary,
)
from kvlab.report.console_common import ms


def summary(record: Record) -> str:
    """One line of what a record says, for the end-of-run listing."""
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


def lines(console: Console, records: Sequence[Record], labbook: str) -> None:
    """Every line a run wrote, one each, and the steps' checks and boundaries."""
    for record in records:
        console.print(f"  {record.record:<10} {record.label:<22} {summary(record)}")
    console.print(f"{len(records)} lines appended to {labbook}")
    for r in records:
        if isinstance(r, ProcedureRecord):
            procedure(console, r)
        elif isinstance(r, BoundaryRecord):
            boundary(console, r)


def procedure(console: Console, r: ProcedureRecord) -> None:
    failed = f" (failed: {', '.join(r.failed)})" if r.failed else ""
    console.print(f"==> {r.step}: {r.verdict}{failed}")
    for c in r.checks:
        console.print(f"    {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}")


def boundary(console: Console, r: BoundaryRecord) -> None:
    console.print(f"==> boundary at concurrency {r.concurrency}: {r.statement}")
    console.print(f"    {'tokens':>7} {'split TTFT':>11} {'baseline':>11} {'ratio':>7}")
    for p in r.points:
        ratio = f"x{p.ratio:.2f}" if p.ratio is not None else "n/a"
        console.print(f"    {p.prompt_tokens_target:>7} {ms(p.split_ttft_p50_s):>11} "
                      f"{ms(p.baseline_ttft_p50_s):>11} {ratio:>7}")


def plans(console: Console, found: Sequence[dict[str, object]]) -> None:
    """A dry run's plans: each one's command line, or why it would not run (a cluster's
    placement first)."""
    for item in found:
        if isinstance(where := item.get("placement"), DryPlacement):
            placement(console, where)
            continue
        node = f" (on {item['node']})" if "node" in item else ""
        console.print(f"==> {item['label']}{node}", markup=False)
        plan = item.get("plan")
        for first in plan.get("companions", []) if isinstance(plan, dict) else []:
            console.print(f"    first, its {first['role']} server:\n    {first['shell']}",
                          markup=False)
        console.print(f"    {item['shell']}" if "plan" in item
                      else f"    not run here: {item['reason']}", markup=False)
        if "note" in item:
            console.print(f"    note: {item['note']}")


def placement(console: Console, p: DryPlacement) -> None:
    """Where a cluster run would put each role, read from the cluster; nothing started."""
    say = functools.partial(console.print, markup=False)  # a node id [c1c1c1c1] is no style
    say(f"==> placement on the Ray cluster at {p.cluster} (from {p.origin})")
    for r in p.roles:
        say(f"    {r.role:<9} {r.node}, {r.url}" + (f" ({r.named_by})" if r.named_by else ""))
    if p.store is not None:
        seen = " and ".join(dict.fromkeys(p.store_seen_by))
        say(f"    store     {p.store} on {seen}: {p.store_from}")
    else:
        say(f"    store     none: {p.store_from}")
    say(f"    nodes     {p.nodes}")
    say(f"    ports are chosen free on each node when it starts; {p.left_to_the_run}")


def replicas(console: Console, lines: Sequence[Record]) -> None:
    """Each arm's figures per prompt set, then the lab's answer."""
    from kvlab.records import ReplicasRecord
    from kvlab.report import replicas as answer

    arms = [r for r in lines if isinstance(r, ReplicasRecord)]
    for note in (r for r in lines if isinstance(r, NotRunRecord)):
        console.print(f"    not run: {note.reason}")
    for prompt_set, group in answer.newest(arms).items():
        table = Table(title=f"N replicas, {prompt_set}")
        for column in answer.COLUMNS:
            table.add_column(column)
        for r in group:
            table.add_row(*answer.cells(r))
        console.print(table)
        console.print("    " + answer.decision(prompt_set, group))


def run_all_plans(console: Console, found: Sequence[dict[str, object]]) -> None:
    """`kvlab run all --dry-run`: each experiment, what it would start and at what sizes,
    whether it would be skipped and why, and how long it took when it last ran here."""
    for item in found:
        rows = item["rows"]
        assert isinstance(rows, list)
        console.print(f"==> {item['experiment']}: {'; '.join(map(str, rows))}")
        engines = item["engines"]
        assert isinstance(engines, dict)
        for name, choice in engines.items():
            state = choice["command"] if choice["found"] \
                else f"installed first by the run; now: {choice['reason']}"
            console.print(f"    engine {name}: {state}")
        if item["skipped"]:
            console.print(f"    skipped: {item['skipped']}")
        sizes = item["sizes"]
        assert isinstance(sizes, dict)
        shown = ", ".join(f"{k} {v}" for k, v in sizes.items() if v not in (None, (), "", False))
        console.print(f"    sizes: {shown or 'its defaults'}")
        plans_ = item["plans"]
        assert isinstance(plans_, list)
        if plans_:
            plans(console, plans_)
        console.print(f"    last run here: {item['last_took']}")


# --- each experiment's view of what it wrote (the registry names it: `Registered.view`) -------
View = Callable[[Console, Sequence[Record], str], None]


def disk_view(console: Console, records: Sequence[Record], labbook: str) -> None:
    """A disk tier's stopwatch as a table of its steps; any other line (mlx-lm's turns) as
    every line is shown."""
    from kvlab.report import console_llama

    for line in records:
        if isinstance(line, DiskRecord):
            console_llama.disk(console, line, labbook)
        else:
            lines(console, [line], labbook)


def interference_view(console: Console, records: Sequence[Record], labbook: str) -> None:
    """The interference pair's load rows, then their comparison."""
    from kvlab.report import console_llama

    *rows, comparison = records
    assert isinstance(comparison, ComparisonRecord)
    console_llama.interference(console, [r for r in rows if isinstance(r, LoadRecord)],
                               comparison, labbook)


def slots_view(console: Console, records: Sequence[Record], labbook: str) -> None:
    """The shared slot store's proof (its last line)."""
    from kvlab.report import console_llama

    assert isinstance(records[-1], ReuseRecord)
    console_llama.shared_slots(console, records[-1], labbook)


def replicas_view(console: Console, records: Sequence[Record], labbook: str) -> None:
    replicas(console, records)


VIEWS: dict[str, View] = {"lines": lines, "disk": disk_view, "interference": interference_view,
                          "slots": slots_view, "replicas": replicas_view}
