"""Pair two load runs from the notebook: the seed's compare-disagg.py, plus kvlab's checks.

Reads only the notebook. Same pairing as the seed (`pairing.py`): the most recent load row per
concurrency level for each label, compared at the levels both share (TTFT p50, TPOT p50, output
tokens/s, as a ratio and a signed percentage), and the most recent `link` record of the
disaggregated label for the bytes that crossed the link. The `comparison` record keeps the
seed's fields.

kvlab adds: same-experiment checks over everything the two labels recorded (model, prompt set,
max tokens, concurrency levels, context length, memory fraction, workload, KV cache type; a
quantised KV cache is never paired with an unquantised one: `same_experiment.py`), bytes per
request three ways (interface or RDMA counters, NIXL's own byte histogram, against the
arithmetic prediction) with a verdict (`link_bytes.py`), the disaggregated run's recorded
topology and (NIXL, Mooncake) which network its side channel used, and for the offload lab
(`offload=True`, or the offload labels, or rows that planned pressure) the pressure each side
ran under, judged as the report judges it (`measure/pressure.py`), since a tier measured
without pressure shows nothing. A level without a TPOT (MAX_TOKENS=1) is "n/a" in the table and
null in the record, with the reason in words beside it.

Under the seed's table (kept line for line), each level's three ratios again with their 95%
intervals and the words (`intervals.py`: a bootstrap over the per-request files, across
repeats when a side has several; "no measurable difference" when the interval spans 1; "no
interval: no per-request data" and the rows' own ratio for rows without a file). The record's
levels carry the same under `intervals`, and `interval_method` says how they were drawn. A
per-request file whose sha256 differs from its row's is refused.

This module owns the comparison itself: the table, the pressure lines, the link lines, the
record and the notebook read; it deliberately leaves which rows are paired, the same-experiment
checks and the byte arithmetic to the three modules named above.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvlab.core import InputError, RefusedError, human_bytes
from kvlab.measure import engine_args, intervals
from kvlab.measure.link_bytes import Bytes, bytes_three_ways
from kvlab.measure.pairing import OFFLOAD_OFF, OFFLOAD_ON, _pick, link_line
from kvlab.measure.pressure import judge_pressure
from kvlab.measure.same_experiment import check_kv_types, experiment_warnings, label_facts
from kvlab.records import (
    ComparisonLevel,
    ComparisonRecord,
    LinkRecord,
    LoadRecord,
    Percentiles,
    Record,
    SidePressure,
    TtftAccount,
    Where,
    comparison_label,
    notebook,
)


def ratio(new: float | None, old: float | None) -> str:
    """`new / old` as `1.50x`; "n/a" when either side was not measured (or old is 0)."""
    return f"{new / old:.2f}x" if new is not None and old else "n/a"


def signed_pct(new: float | None, old: float | None) -> str:
    return f"{(new - old) / old * 100:+.1f}%" if new is not None and old else "n/a"


def _round(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None else None


def pressure(records: list[Record], label: str, rows: dict[int, LoadRecord]) -> SidePressure:
    """The pressure on `label`'s KV cache, level by level (`measure/pressure.py`'s judgement:
    the same one the report and the decisions give); under pressure if any level was, quiet
    if every level was, else unknown."""
    judged = {level: judge_pressure(records, row) for level, row in sorted(rows.items())}
    states = [j.state for j in judged.values()]
    overall = True if True in states else False if states and all(
        s is False for s in states) else None
    cache = next((j for j in judged.values() if j.cache_tokens), None)
    return SidePressure(kv_cache_tokens=cache.cache_tokens if cache else None,
                        kv_cache_tokens_from=cache.cache_from if cache else None,
                        levels={str(level): j.level() for level, j in judged.items()},
                        under_pressure=overall)


def pressure_line(name: str, p: SidePressure) -> str:
    cache = p.kv_cache_tokens
    size = (f"a cache of {cache:,} tokens (from {p.kv_cache_tokens_from})" if cache
            else "a cache of unknown size")
    whys = "; ".join(f"c={level}: {v.why}" for level, v in p.levels.items())
    state = {True: "under pressure",
             False: "quiet: not under pressure, so the tier had nothing to do and this pair "
                    "cannot show what it is worth",
             None: "pressure unknown: nothing measured shows whether blocks were evicted"}[
        p.under_pressure]
    return f"    {name}: {size}; {whys} -> {state}"


def offload_pair(disagg: str, baseline: str, rows: list[LoadRecord]) -> bool:
    """Whether two labels are the offload lab's pressure pair (by label, or a row that
    recorded a pressure plan): their comparison states the pressure, asked or not."""
    return {disagg, baseline} == {OFFLOAD_ON, OFFLOAD_OFF} or any(
        r.pressure is not None for r in rows)


def read_records(path: Path | str) -> list[Record]:
    """Every JSON object in the notebook; an empty notebook is the seed's exit-2 error."""
    records = notebook.read(path).records
    if not records:
        raise InputError(f"No JSON lines found in {path}. Run the load generator first.")
    return records


@dataclass
class Comparison:
    """The printed report (the seed's lines first) and the `comparison` record."""

    lines: list[str]
    record: ComparisonRecord
    warnings: list[str]


def _level_lines(disagg: dict[int, LoadRecord], base: dict[int, LoadRecord],
                 shared: list[int]) -> tuple[list[str], list[ComparisonLevel]]:
    lines = [f"    {'conc':>4}  {'TTFT p50':>18}  {'TPOT p50':>18}  {'out tok/s':>18}"]
    levels = []
    for level in shared:
        d, b = disagg[level], base[level]
        d_ttft, b_ttft = _p50(d.ttft_s), _p50(b.ttft_s)
        # no TPOT (MAX_TOKENS=1: one output token has no time per token) is "n/a", never 0
        d_tpot, b_tpot = _p50(d.tpot_s), _p50(b.tpot_s)
        d_thru, b_thru = d.output_tokens_per_s, b.output_tokens_per_s
        lines.append(
            f"    {level:>4}  {ratio(d_ttft, b_ttft):>8} {signed_pct(d_ttft, b_ttft):>9}  "
            f"{ratio(d_tpot, b_tpot):>8} {signed_pct(d_tpot, b_tpot):>9}  "
            f"{ratio(d_thru, b_thru):>8} {signed_pct(d_thru, b_thru):>9}")
        levels.append(ComparisonLevel(
            concurrency=level, ttft_p50_disagg_s=_round(d_ttft, 4),
            ttft_p50_baseline_s=_round(b_ttft, 4), tpot_p50_disagg_s=_round(d_tpot, 5),
            tpot_p50_baseline_s=_round(b_tpot, 5),
            output_tokens_per_s_disagg=_round(d_thru, 2),
            output_tokens_per_s_baseline=_round(b_thru, 2),
            failed_disagg=d.failed, failed_baseline=b.failed, tpot_p50=_not_measured(d, b)))
    lines += [f"    concurrency {lv.concurrency}: TPOT p50 {lv.tpot_p50}"
              for lv in levels if lv.tpot_p50 is not None]
    return lines, levels


def ttft_difference(a: TtftAccount, b: TtftAccount) -> str:
    """Where A's mean TTFT differs from B's, by the engine's own accounts ("" where neither
    names a part)."""
    parts = [f"{name} {round(x - y, 3) + 0.0:+.3f} s" for name, x, y in (
        ("waiting to be scheduled", a.queue, b.queue),
        ("computing the prompt", a.prefill, b.prefill),
        ("outside the engine", a.outside, b.outside)) if x is not None and y is not None]
    if not parts:
        return ""
    return (f"mean TTFT {a.client_ttft:.3f} s against {b.client_ttft:.3f} s "
            f"({a.client_ttft - b.client_ttft:+.3f} s): " + ", ".join(parts)
            + f" (from {a.source})")


def _account_lines(disagg: dict[int, LoadRecord], base: dict[int, LoadRecord],
                   shared: list[int]) -> list[str]:
    """Each level's TTFT difference by the engines' accounts, where both rows carry one."""
    found = [(level, ttft_difference(a, b)) for level in shared
             if (a := disagg[level].ttft_account) is not None
             and (b := base[level].ttft_account) is not None]
    lines = [f"    concurrency {level}: {words}" for level, words in found if words]
    return ["", "==> Where the TTFT went, by the engines' own accounts", *lines] if lines else []


def _interval_lines(found: dict[int, dict[str, intervals.Interval]],
                    levels: list[ComparisonLevel]) -> list[str]:
    """The level table again, each ratio with its interval (95%, or the level a sequential
    run's rule set); the record's levels gain `intervals` (by metric)."""
    level = intervals.level_words(_confidence(found))
    lines = ["", f"==> Ratios with {level} intervals (bootstrap over requests "
             f"and repeats, seed {intervals.SEED})",
             f"    {'conc':>4}  {'metric':<13}  ratio [interval] and what it shows"]
    for entry in levels:
        by_metric = found[entry.concurrency]
        entry.intervals = {key: iv.as_record() for key, iv in by_metric.items()}
        for metric in intervals.METRICS:
            iv = by_metric[metric.key]
            counts = (f" ({iv.requests[0]} / {iv.requests[1]} requests"
                      + (f", {iv.repeats[0]} / {iv.repeats[1]} repeats" if iv.repeats
                         and max(iv.repeats) > 1 else "") + ")") if iv.requests else ""
            lines.append(f"    {entry.concurrency:>4}  {metric.name:<13}  {iv.cell()}{counts}")
    return lines


def _confidence(found: dict[int, dict[str, intervals.Interval]]) -> float:
    """The level the intervals were read at (the highest, where levels differ)."""
    return max((iv.confidence for by_metric in found.values() for iv in by_metric.values()),
               default=intervals.CONFIDENCE)


def _p50(p: Percentiles | None) -> float | None:
    return p.p50 if p is not None else None


def _not_measured(d: LoadRecord, b: LoadRecord) -> str | None:
    """Say in words which TPOT a level lacks (a null in the record is not an explanation)."""
    gone = [f"the {side} row has no tpot_s (max_tokens {row.max_tokens})"
            for side, row in (("disagg", d), ("baseline", b)) if _p50(row.tpot_s) is None]
    if not gone:
        return None
    return ("n/a: " + "; ".join(gone) + "; a request that returns one token has no time per "
            "output token")




def recorded_topology(link: LinkRecord | None, rows: dict[int, LoadRecord]) -> Where:
    """The run's topology fields (`TOPOLOGY_FIELDS`) as its link line recorded them, else its
    newest load row (all None when neither did: a reader then says "unknown")."""
    s: Where = link if link is not None and link.topology is not None else rows[max(rows)]
    return Where(topology=s.topology, single_machine=s.single_machine, hosts=s.hosts,
                 connector=s.connector, link=s.link, topology_from=s.topology_from,
                 placement=s.placement, nodes=s.nodes, same_machine=s.same_machine,
                 link_speed_mbps=s.link_speed_mbps)


def _link_lines(name: str, link: LinkRecord | None, seen: Bytes) -> list[str]:
    if link is None:
        return [f"==> No link line for label {name}. "
                "Run it through kvlab run-load (or run-load.sh)."]
    side = link.side_channel  # which network a NIXL/Mooncake run crossed, if checked
    side_line = [f"    side channel: {side.verdict}"] if side and side.verdict else []
    if not seen.observed:
        return [f"==> The {name} run recorded no byte counters. Set CLUSTER_IFACE.", *side_line]
    lines = [f"==> Link during the {name} run (iface {link.iface or '-'})"]
    names = {"iface": "interface counters", "rdma": "RDMA port counters",
             "nixl": "NIXL's own count", "store": "shared store growth",
             "store_read": "read from the store"}
    for source, value in seen.observed.items():
        lines.append(f"    bytes moved per request, {names[source]:<20} {human_bytes(value)}")
    if seen.predicted is not None:
        lines.append(f"    one request's cache, from arithmetic          "
                     f"{human_bytes(seen.predicted)}  "
                     f"({seen.prompt_tokens or 0:,.0f} prompt tokens, {seen.prompt_tokens_from})")
    if seen.transfer:
        t = seen.transfer
        lines.append(f"    NIXL's own timing: {t.transfers:,.0f} transfers of "
                     f"{human_bytes(t.bytes_per_transfer)}, {t.seconds_per_transfer:.4f} s "
                     f"each ({t.gbit_per_s:.2f} Gbit/s)")
    lines += side_line
    if seen.verdict:
        lines.append(f"    verdict ({seen.verdict_source}): {seen.verdict}")
    else:
        lines.append("    no verdict: give --kv-bytes-per-token or --model-config "
                     "to predict the cache")
    return lines


def compare_runs(records: list[Record], book: str, disagg: str, baseline: str, *,
            kv_bytes_per_token: float | None = None, prompt_tokens: float | None = None,
            note: str = "", lab: str = notebook.LAB_PD, offload: bool = False,
            ignore_args: tuple[str, ...] = ()) -> Comparison:
    """Pair two labels' load rows; the lines to print and the record to append. Refused
    (RefusedError) when the runs' engines ran with other arguments than the variable."""
    rows_d, rows_b = _pick(records, disagg, baseline)
    facts_d, facts_b = label_facts(records, disagg), label_facts(records, baseline)
    check_kv_types(disagg, baseline, facts_d, facts_b)
    link = link_line(records, disagg)
    engines = {disagg: engine_args.engines_of(rows_d.values(), link),
               baseline: engine_args.engines_of(rows_b.values(), link_line(records, baseline))}
    differ = engine_args.differences(engines[disagg], engines[baseline], ignore_args)
    if differ:
        raise RefusedError(engine_args.refusal(disagg, baseline, differ))
    shared = sorted(set(rows_d) & set(rows_b))
    warnings = experiment_warnings(disagg, baseline, rows_d, rows_b, facts_d, facts_b)
    lines: list[str] = []
    if warnings:
        lines += ["These two runs are not the same experiment:", *warnings,
                  "  Fix the settings and run both again; the comparison below is not valid.", ""]
    lines.append(f"==> {disagg} against {baseline}, from {book}")
    table, levels = _level_lines(rows_d, rows_b, shared)
    lines += table
    lines += ["", "    Below 1.00x on time to first token, the first run was faster; above it,",
              "    slower. For a prefill/decode split on ordinary Ethernet, slower is the usual",
              "    and honest result."]
    ratios = intervals.pair_levels(Path(book), records, rows_d, rows_b)
    lines += _interval_lines(ratios, levels)
    lines += _account_lines(rows_d, rows_b, shared)
    seen = bytes_three_ways(link, rows_d, shared, kv_bytes_per_token, prompt_tokens)
    where = Where()  # a tier pair's comparison states its pressure, not a topology
    sides: dict[str, SidePressure] | None = None
    offload = offload or offload_pair(disagg, baseline, [*rows_d.values(), *rows_b.values()])
    if offload:
        p_on, p_off = pressure(records, disagg, rows_d), pressure(records, baseline, rows_b)
        lines += ["", "==> Pressure on the KV cache", pressure_line(disagg, p_on),
                  pressure_line(baseline, p_off)]
        sides = {disagg: p_on, baseline: p_off}
    else:
        where = recorded_topology(link, rows_d)
        lines += ["", *_link_lines(disagg, link, seen),
                  f"    topology of {disagg}, as recorded: "
                  f"{where.topology if where.topology is not None else 'unknown'}, link "
                  f"{where.link if where.link is not None else 'unknown'}"]
    lines += [f"    note: {n}" for label, found in engines.items()
              if (n := engine_args.not_compared(label, found))]
    observed = seen.observed.get("iface")
    record = ComparisonRecord(
        label=comparison_label(disagg, baseline), lab=lab,
        disagg_label=disagg, baseline_label=baseline,
        model=rows_d[shared[0]].model, prompt_set=rows_d[shared[0]].prompt_set,
        connector=link.connector if link else where.connector,
        iface=link.iface if link else None,
        kv_bytes_per_token=kv_bytes_per_token or None, prompt_tokens=prompt_tokens or None,
        predicted_bytes_per_request=seen.predicted,
        observed_bytes_per_request=round(observed, 1) if observed is not None else None,
        levels=levels, same_experiment=not warnings, note=note,
        differences=[w.strip() for w in warnings], bytes=seen.as_record(),
        kv_cache_type={disagg: facts_d.kv_cache_type, baseline: facts_b.kv_cache_type},
        side_channel=link.side_channel if link else None, offload=offload,
        interval_method=intervals.method_at(_confidence(ratios)), pressure=sides,
        topology=where.topology, single_machine=where.single_machine, hosts=where.hosts,
        link=where.link, topology_from=where.topology_from, placement=where.placement,
        nodes=where.nodes, same_machine=where.same_machine,
        link_speed_mbps=where.link_speed_mbps,
        engines={k: v for k, v in engines.items() if v} or None)
    return Comparison(lines, record, warnings)
