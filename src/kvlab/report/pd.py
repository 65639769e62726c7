"""The P/D lab's five-row table: the baseline, the split on two machines (shared and NIXL),
the split on one device (loopback), and llama-server's slot interference. Split runs are
placed by the connector and topology they recorded (`placement.py`); a run that matches no
row of the lab's table gets a row of its own that says what was recorded, "unknown" included.
A split's TTFT against the baseline, and the interference row's 4 slots against 1, carry their
95% intervals from the per-request files (`intervals.py`; a `--repeat auto` run's at its rule's
level, the rule and why it stopped in the evidence), or the point ratio and "no interval"
with the reason. The baseline and each split also state their capacity at the latency target
(the highest request rate that met it), where a `capacity` line was recorded. A split's TTFT
is also taken apart into prefill, hand-over, decode, proxy and the wire between client and
proxy, from kvlab's proxy's per-request timeline (`records.load.TtftParts`); a model that
reasons first shows its first answer token beside its TTFT."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvlab.core import connectors, human_bytes
from kvlab.measure import NOT_CROSSED, intervals, paired_rows
from kvlab.records import (
    BASELINE,
    INTERFERENCE,
    LOOPBACK,
    SPLIT,
    TWO_MACHINES,
    TWO_MACHINES_NIXL,
    TWO_MACHINES_SHARED,
    UNKNOWN,
    ComparisonLevel,
    ComparisonRecord,
    LinkRecord,
    LoadRecord,
    NixlTransfer,
    Notebook,
    Percentiles,
    Row,
    interference_label,
)
from kvlab.records import SPLIT_LOOPBACK as LOOPBACK_ROW
from kvlab.report.common import (
    NO_FIGURE,
    Line,
    Table,
    all_failed,
    brief,
    failed_words,
    latest,
    load_rows,
    measured_on,
    missing,
    num,
    oracle_words,
    sequential_words,
)
from kvlab.report.offload import capacity_words
from kvlab.report.placement import Group, split_groups, take

PD_COLUMNS = ["TTFT p50 (s)", "TPOT p50 (s)", "Output tokens/s", "Bytes per request",
              "TTFT against the baseline", "TTFT parts, mean (ms)"]
WIDTH = len(PD_COLUMNS)


# (row: its title, the lab's link and the not-run label that explains it; connector (None:
# any), topology)
SPLIT_ROWS: tuple[tuple[Row, str | None, str], ...] = (
    (TWO_MACHINES_SHARED, connectors.SHARED.name, TWO_MACHINES),
    (TWO_MACHINES_NIXL, connectors.NIXL.name, TWO_MACHINES),
    (LOOPBACK_ROW, None, LOOPBACK),
)
Figure = Callable[[LoadRecord], float | None]


def pd_table(book: Notebook) -> Table:
    table = Table("P/D lab: the split against one machine", "Configuration", PD_COLUMNS)
    table.lines.append(_baseline_row(book))
    groups = split_groups(book)
    for row, connector, topology in SPLIT_ROWS:
        group = take(groups, topology, connector)
        table.lines.append(_split_row(book, row, row.title, row.how, group) if group
                           else missing(row, book, WIDTH))
    for group in groups:  # what matched no row of the lab's table, named as recorded
        table.lines.append(_split_row(book, SPLIT, _own_name(group), None, group))
    table.lines.append(_interference_row(book))
    return table


def _own_name(group: Group) -> str:
    if group.topology == UNKNOWN:
        return f"Split `{group.label}`, topology unknown (not recorded)"
    return f"Split `{group.label}`: {group.topology}, {group.connector} connector"


def _p50(p: Percentiles | None) -> float | None:
    return p.p50 if p is not None else None


def ttft_p50(row: LoadRecord) -> float | None:
    return _p50(row.ttft_s)


def tpot_p50(row: LoadRecord) -> float | None:
    return _p50(row.tpot_s)


def throughput(row: LoadRecord) -> float | None:
    return row.output_tokens_per_s


def by_level(rows: Sequence[LoadRecord], key: str, figure: Figure) -> str:
    """One cell for a sweep: each level's `figure` (of the rows' `key`), then the levels,
    e.g. `0.21 / 0.35 (c=1/4)`; a level whose every request failed reads "failed"."""
    values = ["failed" if all_failed(r) else num(figure(r)) for r in rows]
    levels = "/".join(str(r.concurrency) for r in rows)
    if all(v == "n/a" for v in values):
        return f"n/a: no {key} in the load rows (c={levels})"
    return f"{' / '.join(values)} (c={levels})"


def _baseline_row(book: Notebook) -> Line:
    rows = load_rows(book, BASELINE.label)
    if not rows:
        return missing(BASELINE, book, WIDTH)
    if all(all_failed(r) for r in rows):
        return failed_line(book, BASELINE, BASELINE.title, BASELINE.how, rows, BASELINE.label)
    evidence = [*_row_evidence(rows, book.of(LinkRecord, BASELINE.label), None),
                capacity_words(book, BASELINE.label)]
    return Line(BASELINE.title, BASELINE.how, [*_figures(rows), "none", "the reference",
                                               "none: one instance, no proxy"],
                evidence, measured_on(book, rows[-1]), _ok_word(rows), BASELINE.command,
                anchor=BASELINE.label)


def _ok_word(rows: list[LoadRecord]) -> str:
    """"measured", or how many requests failed."""
    failed = sum(r.failed or 0 for r in rows)
    sent = sum((r.ok or 0) + (r.failed or 0) for r in rows)
    if failed and failed == sent:
        return f"all {sent} requests failed"
    return f"{failed} of {sent} failed" if failed else "measured"


def failed_line(book: Notebook, row: Row, name: str, how: str, rows: list[LoadRecord],
                anchor: str) -> Line:
    """A row whose newest run measured nothing: every level's requests failed. Its first
    cell says how (the newest level's), the evidence each level's."""
    words = [f"c={r.concurrency}: {failed_words(r)}" for r in rows]
    first = failed_words(rows[-1])
    return Line(name, how, [brief(first), *([NO_FIGURE] * (WIDTH - 1))],
                [*words, *([first] if brief(first) != first else [])],
                measured_on(book, rows[-1]), _ok_word(rows), row.command, anchor=anchor)


def _split_row(book: Notebook, row: Row, name: str, link: str | None, group: Group) -> Line:
    """A split run's row; `link` is the lab's expected link (None: a row of its own, which
    shows only what was recorded)."""
    if all(all_failed(r) for r in group.rows):
        return failed_line(book, row, name, link or group.where(), group.rows, group.label)
    recorded = group.rows[-1].link or (group.link.link if group.link else None) or UNKNOWN
    if link is None or recorded == link:
        link_cell = recorded
    elif recorded == UNKNOWN:
        link_cell = f"{link} (link not recorded)"
    else:
        link_cell = f"{link} (recorded: {recorded})"
    against = _against_baseline(book, group)
    rule = sequential_words(book.records, group.rows[-1], BASELINE.label) if against else None
    evidence = [group.where(), *_row_evidence(group.rows, [group.link] if group.link else [],
                                              group.comparison),
                *(["TTFT p50 against the baseline: " + ", ".join(against)] if against else []),
                *([rule] if rule else []), capacity_words(book, group.label)]
    bytes_cell, crossed = _bytes_cell(group.comparison)
    verdict = crossed or _ok_word(group.rows)
    return Line(name, link_cell, [*_figures(group.rows), bytes_cell,
                                  "; ".join(against) or "no comparison (kvlab compare)",
                                  parts_cell(group.rows)],
                evidence, measured_on(book, group.rows[-1]), verdict, row.command,
                anchor=group.label)


def _figures(rows: list[LoadRecord]) -> list[str]:
    return [ttft_cell(rows), by_level(rows, "tpot_s", tpot_p50),
            by_level(rows, "output_tokens_per_s", throughput)]


def ttft_cell(rows: Sequence[LoadRecord]) -> str:
    """TTFT p50 by level; where requests reasoned first, their first answer token beside it
    (TTFT is then a reasoning token's, `observe/sse.py`)."""
    cell = by_level(rows, "ttft_s", ttft_p50)
    if not any(r.reasoning_requests for r in rows):
        return cell
    answers = by_level(rows, "ttft_answer_s", lambda r: _p50(r.ttft_answer_s))
    reasoned = "/".join(str(r.reasoning_requests or 0) for r in rows)
    return f"{cell}; first answer token {answers}, after reasoning in {reasoned} requests"


def parts_cell(rows: Sequence[LoadRecord]) -> str:
    """Each level's mean TTFT taken apart by kvlab's proxy's timeline, in milliseconds."""
    cells = []
    for r in rows:
        p = r.ttft_parts
        if p is None:
            continue
        ms = [f"{name} {v * 1000:.1f}" for name, v in (
            ("prefill", p.prefill), ("hand-over", p.handover), ("decode", p.decode),
            ("proxy", p.proxy), ("wire", p.wire))]
        without = f", {p.without} without" if p.without else ""
        cells.append(f"c={r.concurrency}: {' + '.join(ms)} = {p.ttft_mean * 1000:.1f} "
                     f"({p.requests} requests{without})")
    if not cells:
        return ("n/a: no proxy timeline in the load rows (not through kvlab's proxy, or "
                "recorded before kvlab kept one)")
    return "; ".join(cells)


def _row_evidence(rows: list[LoadRecord], links: list[LinkRecord],
                  comparison: ComparisonRecord | None) -> list[str]:
    evidence = [f"{sum(r.ok or 0 for r in rows)} ok / {sum(r.failed or 0 for r in rows)} failed",
                *(f"c={r.concurrency}: {failed_words(r)}" for r in rows if all_failed(r)),
                f"prompt set {rows[0].prompt_set or 'not recorded'}, max_tokens "
                f"{rows[0].max_tokens or 'not recorded'}"]
    hit = [r.prefix_hit_rate for r in rows]
    if any(h is not None for h in hit):
        evidence.append("prefix hit rate " + " / ".join(num(h, 2) for h in hit))
    for r in rows:
        evidence += [f"c={r.concurrency}: {w}" for w in oracle_words(r)]
    return evidence + _split_evidence(links[-1] if links else None, comparison)


def _split_evidence(link: LinkRecord | None, comparison: ComparisonRecord | None) -> list[str]:
    out = []
    deltas = link.metric_deltas if link else {}
    legs = (link.legs if link else None) or {}
    if legs.get("prefill") in deltas and legs.get("decode") in deltas:
        prefill, decode = deltas[legs["prefill"]], deltas[legs["decode"]]
        via = link.connector if link else None
        source = "the store" if via is None or connectors.is_shared_store(via) \
            else f"prefill over {via}"
        out.append(f"both legs ran: prefill served {num(prefill.get('requests_succeeded'), 0)} "
                   f"requests, decode took {num(decode.get('external_prefix_cache_hits'), 0)} "
                   f"prompt tokens from {source}")
    if comparison:
        seen = comparison.bytes
        if seen is not None and seen.verdict:
            out.append(str(seen.verdict))
        if (timing := transfer_words(seen.nixl_transfer if seen is not None else None,
                                     comparison)) is not None:
            out.append(timing)
    return out


def transfer_words(timing: NixlTransfer | None, comparison: ComparisonRecord) -> str | None:
    """NIXL's own timing of its transfers, against the time predicted before the run."""
    if not timing:
        return None
    predicted = comparison.transfer_predicted_s
    return (f"NIXL's own timing: {num(timing.transfers, 0)} transfers of "
            f"{float(timing.bytes_per_transfer):,.0f} bytes, "
            f"{num(timing.seconds_per_transfer, 4)} s each "
            f"({num(timing.gbit_per_s, 2)} Gbit/s; over every level, so at higher "
            "concurrency transfers overlap and share the link)"
            + (f" against {num(predicted, 4)} s predicted at "
               f"{num(comparison.link_gbps_predicted, 2)} Gbit/s" if predicted else ""))


def _against_baseline(book: Notebook, group: Group) -> list[str]:
    """The split's TTFT p50 over the baseline's at each level its comparison paired: with the
    95% interval where both sides have per-request data, else the comparison's ratio."""
    if group.comparison is None:
        return []
    base = paired_rows(book.records, group.label, BASELINE.label)[1]  # its own run's
    mine = {r.concurrency: r for r in group.rows}
    cells = []
    for lv in group.comparison.levels:
        level = lv.concurrency
        if level in mine and level in base:
            iv = intervals.ttft(book.path, book.records, mine[level], base[level])
            cells.append(f"c={level} {iv.cell()}")
        elif _ratio(lv) is not None:  # the comparison paired rows the group no longer holds
            cells.append(f"c={level} {num(_ratio(lv), 2)}x ({intervals.NO_DATA})")
    return cells


def _ratio(level: ComparisonLevel) -> float | None:
    d, b = level.ttft_p50_disagg_s, level.ttft_p50_baseline_s
    return d / b if d and b else None


def _bytes_cell(comparison: ComparisonRecord | None) -> tuple[str, str]:
    """Bytes per request by source against the prediction, and the byte verdict (the full
    verdict goes to the evidence)."""
    if comparison is None:
        return "n/a: no comparison yet", ""
    seen = comparison.bytes
    if seen is None:
        return "not recorded: no byte counters", ""
    parts = [f"{source} {human_bytes(float(v))}"
             for source, v in seen.observed_bytes_per_request_by_source.items()]
    if seen.predicted_bytes_per_request:
        parts.append(f"predicted {human_bytes(float(seen.predicted_bytes_per_request))}")
    crossed = "" if not seen.verdict else (
        "no KV moved" if seen.verdict == NOT_CROSSED else "unclear whether KV moved"
        if seen.verdict.startswith("unclear") else "KV moved")
    return ", ".join(parts) or "not recorded: no byte counters", crossed


def _interference_row(book: Notebook) -> Line:
    four = load_rows(book, interference_label(4))
    one = load_rows(book, interference_label(1))
    if not four or not one:
        return missing(INTERFERENCE, book, WIDTH, how="none")
    a, b = four[-1], one[-1]

    def pair(figure: Figure) -> str:
        return f"{num(figure(a))} vs {num(figure(b))}"

    comparison = latest(book, ComparisonRecord, INTERFERENCE.label)
    evidence = [f"concurrency {a.concurrency}, {a.requests} requests each, "
                f"prompt set {a.prompt_set}",
                "4 slots first, 1 slot second: the one variable changed"]
    verdict = "measured"
    if comparison and comparison.same_experiment is False:
        evidence.append("NOT the same experiment: " + ", ".join(comparison.differs or []))
        verdict = "not the same experiment"
    ratio = "not at one concurrency"
    if a.concurrency == b.concurrency:
        iv = intervals.ttft(book.path, book.records, a, b)
        evidence.append(f"TTFT p50, 4 slots against 1: {iv.cell()}")
        ratio = f"{iv.cell()} (4 slots / 1)"
    return Line(INTERFERENCE.title, "none", [pair(ttft_p50), pair(tpot_p50), pair(throughput),
                                             "none", ratio, "none: no proxy"],
                evidence, measured_on(book, a), verdict, INTERFERENCE.command,
                anchor=INTERFERENCE.label)
