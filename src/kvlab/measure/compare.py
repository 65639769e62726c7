"""Pair two load runs from the notebook: the seed's compare-disagg.py, plus kvlab's checks.

Reads only the notebook. Same pairing as the seed: the most recent load row per concurrency
level for each label, compared at the levels both share (TTFT p50, TPOT p50, output tokens/s,
as a ratio and a signed percentage), and the most recent `link` record of the disaggregated
label for the bytes that crossed the link. The `comparison` record keeps the seed's fields.

kvlab adds: same-experiment checks over everything the two labels recorded (model, prompt set,
max tokens, concurrency levels, context length, memory fraction, workload, KV cache type; a
quantised KV cache is never paired with an unquantised one), bytes per request three ways
(interface or RDMA counters, NIXL's own byte histogram, against the arithmetic prediction) with
a verdict, the disaggregated run's recorded topology and (NIXL, Mooncake) which network its
side channel used, and for the offload lab (`offload=True`, or the offload labels, or rows that
planned pressure) the pressure each side ran under, judged as the report judges it
(`measure/pressure.py`), since a tier measured without pressure shows nothing. A level
without a TPOT (MAX_TOKENS=1) is "n/a" in the table and null in the record, with the reason in
words beside it.

Under the seed's table (kept line for line), each level's three ratios again with their 95%
intervals and the words (`intervals.py`: a bootstrap over the per-request files, across
repeats when a side has several; "no measurable difference" when the interval spans 1; "no
interval: no per-request data" and the rows' own ratio for rows without a file). The record's
levels carry the same under `intervals`, and `interval_method` says how they were drawn. A
per-request file whose sha256 differs from its row's is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kvlab.core import InputError, RefusedError, human_bytes
from kvlab.measure import engine_args, intervals
from kvlab.measure.pressure import judge_pressure, same_engines, tier_too_small
from kvlab.records import (
    PRESSURE_OFF,
    PRESSURE_ON,
    BytesEvidence,
    CapacityRecord,
    ComparisonLevel,
    ComparisonRecord,
    CrossingRecord,
    DiskRecord,
    LinkRecord,
    LoadRecord,
    NixlTransfer,
    Percentiles,
    PredictionRecord,
    Record,
    ReuseRecord,
    SidePressure,
    StartupRecord,
    Where,
    leg_of,
    notebook,
)

CROSSED = "the cache crossed the link"
NOT_CROSSED = "it did not: decode is prefilling by itself"
UNCLEAR = "unclear: the link carried between 1% and 10% of the predicted cache"
DECODE_DID_NOT_PREFILL = (
    "the cache crossed the store: decode computed only {share:.0%} of its prompt tokens itself "
    "(the rest it loaded, once per distinct prefix, and then found in its own prefix cache)"
)
QUANTISED = frozenset({"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"})
OFFLOAD_ON, OFFLOAD_OFF = PRESSURE_ON.label, PRESSURE_OFF.label
T = TypeVar("T")


def comparison_label(disagg: str, baseline: str) -> str:
    """The label of the comparison line that pairs two labels' load rows."""
    return f"{disagg}-vs-{baseline}"


def load_rows(records: list[Record], label: str) -> dict[int, LoadRecord]:
    """The most recent load-generator row per concurrency level, for one label (a row whose
    every request failed has no percentiles and is left out)."""
    return {r.concurrency: r for r in records
            if isinstance(r, LoadRecord) and r.label == label and r.ttft_s is not None}


def paired_rows(records: list[Record], label_a: str,
                label_b: str) -> tuple[dict[int, LoadRecord], dict[int, LoadRecord]]:
    """Both labels' rows for comparing them: where the newest row of `label_a` comes from a
    `kvlab run` that measured `label_b` too (one run_id), both sides come from that run
    alone, so that a later or an older run of one side (a capacity search's, another split's
    baseline) is never paired with it; otherwise each label's newest row per level. The host
    tier's pair is `tier_pair`'s: a tier that held the working set."""
    if (label_a, label_b) == (OFFLOAD_ON, OFFLOAD_OFF):
        return tier_pair(records)
    return _paired(records, label_a, label_b)


def tier_pair(records: list[Record], *, smaller_tier: bool = False
              ) -> tuple[dict[int, LoadRecord], dict[int, LoadRecord]]:
    """The host tier's (on, off) pair from the newest run whose tier could hold its working set
    (or did not record whether), or with `smaller_tier` the newest whose tier could not: a
    run with `--tier-gb` below the working set never stands in for one that held it."""
    def other_kind(r: Record) -> bool:
        return (isinstance(r, LoadRecord) and r.label == OFFLOAD_ON
                and tier_too_small(r) != smaller_tier)
    runs = {r.run_id for r in records if other_kind(r) and r.run_id is not None}
    kept = [r for r in records if r.run_id not in runs and not other_kind(r)]
    on, off = _paired(kept, OFFLOAD_ON, OFFLOAD_OFF)
    if smaller_tier and not on:  # a tier-off run alone is no smaller-tier experiment
        return {}, {}
    return on, off


def tier_sides(records: list[Record], *, smaller_tier: bool = False
               ) -> dict[str, dict[int, LoadRecord]]:
    """`tier_pair`'s two sides by label."""
    on, off = tier_pair(records, smaller_tier=smaller_tier)
    return {OFFLOAD_ON: on, OFFLOAD_OFF: off}


def _paired(records: list[Record], label_a: str,
            label_b: str) -> tuple[dict[int, LoadRecord], dict[int, LoadRecord]]:
    """Both sides from the newest run that measured both: a later run of one side only (a
    capacity search in a call of its own) is not set against another run's other side."""
    newest_first = (r.run_id for r in reversed(records) if isinstance(r, LoadRecord)
                    and r.label == label_a and r.ttft_s is not None and r.run_id is not None)
    for run_id in dict.fromkeys(newest_first):
        run = [r for r in records if r.run_id == run_id]
        rows_b = load_rows(run, label_b)
        if rows_b:
            return load_rows(run, label_a), rows_b
    return load_rows(records, label_a), load_rows(records, label_b)


def link_line(records: list[Record], label: str) -> LinkRecord | None:
    """The most recent `link` record of one label."""
    found = [r for r in records if isinstance(r, LinkRecord) and r.label == label]
    return found[-1] if found else None


def ratio(new: float | None, old: float | None) -> str:
    """`new / old` as `1.50x`; "n/a" when either side was not measured (or old is 0)."""
    return f"{new / old:.2f}x" if new is not None and old else "n/a"


def signed_pct(new: float | None, old: float | None) -> str:
    return f"{(new - old) / old * 100:+.1f}%" if new is not None and old else "n/a"


def _round(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None else None


Fact = str | int | float


@dataclass(frozen=True)
class Facts:
    """Facts beyond the seed's three that make two runs the same experiment, as the records
    of one label stated them (None: none did)."""

    context_length: int | None = None
    memory_fraction: float | None = None
    preamble_tokens: int | None = None
    workload_seed: int | None = None
    endpoint: str | None = None
    engine: str | None = None
    block_size: int | None = None
    kv_cache_type: str | None = None

    def named(self) -> tuple[tuple[str, Fact | None], ...]:
        """Each fact by its field name, in the order the warnings say them."""
        return (("context_length", self.context_length),
                ("memory_fraction", self.memory_fraction),
                ("preamble_tokens", self.preamble_tokens),
                ("workload_seed", self.workload_seed), ("endpoint", self.endpoint),
                ("engine", self.engine), ("block_size", self.block_size),
                ("kv_cache_type", self.kv_cache_type))

    def then(self, newer: Facts) -> Facts:
        """These facts, each that `newer` states replaced by its value."""
        return Facts(context_length=_newer(self.context_length, newer.context_length),
                     memory_fraction=_newer(self.memory_fraction, newer.memory_fraction),
                     preamble_tokens=_newer(self.preamble_tokens, newer.preamble_tokens),
                     workload_seed=_newer(self.workload_seed, newer.workload_seed),
                     endpoint=_newer(self.endpoint, newer.endpoint),
                     engine=_newer(self.engine, newer.engine),
                     block_size=_newer(self.block_size, newer.block_size),
                     kv_cache_type=_newer(self.kv_cache_type, newer.kv_cache_type))


def _newer(old: T | None, new: T | None) -> T | None:
    return new if new is not None else old


def stated(record: Record) -> Facts:
    """The facts one record states, by the fields its kind declares."""
    if isinstance(record, LoadRecord):
        return Facts(context_length=record.context_length,
                     memory_fraction=record.memory_fraction,
                     preamble_tokens=record.preamble_tokens, workload_seed=record.workload_seed,
                     endpoint=record.endpoint, engine=record.engine,
                     kv_cache_type=record.kv_cache_type)
    if isinstance(record, CapacityRecord):
        return Facts(context_length=record.context_length,
                     memory_fraction=record.memory_fraction, kv_cache_type=record.kv_cache_type)
    if isinstance(record, StartupRecord):
        return Facts(memory_fraction=record.memory_fraction, engine=record.engine)
    if isinstance(record, ReuseRecord | DiskRecord):
        return Facts(engine=record.engine, kv_cache_type=record.kv_cache_type)
    if isinstance(record, LinkRecord):
        return Facts(context_length=record.context_length)
    if isinstance(record, PredictionRecord | CrossingRecord):
        return Facts(block_size=record.block_size)
    return Facts()


def label_facts(records: list[Record], label: str) -> Facts:
    """Facts any record of `label` states (load rows, link, startup), the latest winning."""
    out, labels = Facts(), same_engines(label)
    for record in records:
        if record.label in labels:
            out = out.then(stated(record))
    return out


def check_kv_types(a: str, b: str, facts_a: Facts, facts_b: Facts) -> None:
    """Refuse to pair a quantised KV cache (q8_0, q4_0, ...) with an unquantised one."""
    ta, tb = facts_a.kv_cache_type, facts_b.kv_cache_type
    if ta is None or tb is None or ta == tb:
        return
    if (ta in QUANTISED) != (tb in QUANTISED):
        raise RefusedError(
            f"{a} ran with kv_cache_type {ta} and {b} with {tb}: a quantised KV cache against an "
            "unquantised one measures the quantisation, not the tier; run both with the same "
            "LLAMA_CACHE_TYPE")


def experiment_warnings(a: str, b: str, rows_a: dict[int, LoadRecord],
                        rows_b: dict[int, LoadRecord],
                        facts_a: Facts, facts_b: Facts) -> list[str]:
    """Every way the two runs differ; empty when they are the same experiment."""
    out = []
    for level in sorted(set(rows_a) & set(rows_b)):
        d, base = rows_a[level], rows_b[level]
        seeds: tuple[tuple[str, Fact | None, Fact | None], ...] = (
            ("model", d.model, base.model), ("prompt_set", d.prompt_set, base.prompt_set),
            ("max_tokens", d.max_tokens, base.max_tokens))
        for key, mine, theirs in seeds:
            if mine != theirs:
                out.append(f"  concurrency {level}: {key} differs ({mine!r} against {theirs!r})")
        out += _prompt_size_warning(level, d, base)
    if set(rows_a) != set(rows_b):
        out.append(f"  concurrency levels differ ({sorted(rows_a)} against {sorted(rows_b)})")
    for (key, mine), (_, theirs) in zip(facts_a.named(), facts_b.named(), strict=True):
        if mine is not None and theirs is not None and mine != theirs:
            out.append(f"  {key} differs ({mine!r} against {theirs!r})")
    return out


PROMPT_SIZE_TOLERANCE = 0.05  # the same prompts, counted by the server, differ by less


def _prompt_size_warning(level: int, a: LoadRecord, b: LoadRecord) -> list[str]:
    """The servers' own prompt-token counts: the same workload sized two ways is two
    experiments (e.g. one side sized by the tokenizer, the other by the word estimate)."""
    ma, mb = a.prompt_tokens_mean, b.prompt_tokens_mean
    if not ma or not mb or abs(ma - mb) <= PROMPT_SIZE_TOLERANCE * max(ma, mb):
        return []
    return [f"  concurrency {level}: the server counted {ma:,.0f} prompt tokens a request "
            f"against {mb:,.0f}: the prompts differ in size"]


@dataclass
class Bytes:
    """Bytes per request: predicted, and observed as each source saw it."""

    predicted: float | None = None
    prompt_tokens: float | None = None
    prompt_tokens_from: str | None = None
    observed: dict[str, float] = field(default_factory=dict)  # source -> bytes/request
    verdict: str | None = None
    verdict_source: str | None = None
    decode_computed_share: float | None = None
    transfer: NixlTransfer | None = None  # NIXL's own count and timing of its transfers

    def as_record(self) -> BytesEvidence:
        """The bytes as a comparison line holds them (observed to one decimal)."""
        return BytesEvidence(
            predicted_bytes_per_request=self.predicted, prompt_tokens=self.prompt_tokens,
            prompt_tokens_from=self.prompt_tokens_from,
            observed_bytes_per_request_by_source={k: round(v, 1)
                                                  for k, v in self.observed.items()},
            verdict=self.verdict, verdict_source=self.verdict_source,
            decode_computed_share=self.decode_computed_share, nixl_transfer=self.transfer)


def _mean_prompt_tokens(rows: dict[int, LoadRecord], levels: list[int]) -> float | None:
    pairs: list[tuple[float, int]] = []
    for level in levels:
        mean, ok = rows[level].prompt_tokens_mean, rows[level].ok or 0
        if mean is not None and ok > 0:
            pairs.append((float(mean), ok))
    total = sum(n for _, n in pairs)
    return sum(m * n for m, n in pairs) / total if total else None


def _nixl_total(link: LinkRecord) -> float | None:
    values = [float(v.nixl_bytes) for v in (link.nixl or {}).values()
              if v.nixl_bytes is not None]
    return sum(values) if values else None


def nixl_timing(link: LinkRecord) -> NixlTransfer | None:
    """NIXL's transfers over the run, by its own histograms: how many, bytes and seconds
    each, and the rate they imply (None when the engine exported no timing)."""
    per_url = list((link.nixl or {}).values())
    count = sum(float(v.nixl_transfers or 0) for v in per_url)
    seconds = sum(float(v.nixl_transfer_s or 0) for v in per_url)
    moved = sum(float(v.nixl_bytes or 0) for v in per_url)
    if not count or not seconds:
        return None
    return NixlTransfer(transfers=count, bytes_per_transfer=round(moved / count, 1),
                        seconds_per_transfer=round(seconds / count, 6),
                        gbit_per_s=round(moved * 8 / seconds / 1e9, 3))


def bytes_three_ways(link: LinkRecord | None, rows: dict[int, LoadRecord], levels: list[int],
                     kv_bytes_per_token: float | None, prompt_tokens: float | None) -> Bytes:
    """Arithmetic prediction against interface, RDMA and NIXL bytes, per request."""
    out = Bytes()
    if prompt_tokens:
        out.prompt_tokens, out.prompt_tokens_from = prompt_tokens, "flag"
    else:
        out.prompt_tokens = _mean_prompt_tokens(rows, levels)
        out.prompt_tokens_from = "server usage" if out.prompt_tokens else None
    if kv_bytes_per_token and out.prompt_tokens:
        out.predicted = kv_bytes_per_token * out.prompt_tokens
    # the link's counters ran over every request sent, each level's warm-up included
    requests = sum(rows[lv].requests + (rows[lv].warmup_requests or 0) for lv in levels)
    if link is None or not requests:
        return out
    if link.rx_bytes is not None and link.tx_bytes is not None:
        out.observed["iface"] = max(link.rx_bytes, link.tx_bytes) / requests
    if link.rdma is not None:
        out.observed["rdma"] = max(link.rdma.rx_bytes, link.rdma.tx_bytes) / requests
    nixl = _nixl_total(link)
    if nixl is not None:
        out.observed["nixl"] = nixl / requests
        out.transfer = nixl_timing(link)
    if link.store_bytes is not None:
        out.observed["store"] = link.store_bytes / requests
    loaded = _external_tokens(link)
    if link.connector == "shared" and loaded is not None and kv_bytes_per_token:
        # a shared store is written once per distinct prompt but read by every request that
        # hits it: the tokens decode took from it are the bytes that crossed
        out.observed["store_read"] = loaded * kv_bytes_per_token / requests
    # a shared-directory store moves KV through files: on loopback, the interface counters
    # are only the HTTP around it (and every other local conversation)
    _verdict(out, iface_blind=link.connector == "shared" and (link.iface or "").startswith("lo"))
    share = _decode_computed_share(link)
    if link.connector == "shared" and share is not None:
        out.decode_computed_share = round(share, 4)
        if share <= 0.5:  # bytes per request undercount a store read once and then cached
            out.verdict, out.verdict_source = DECODE_DID_NOT_PREFILL.format(share=share), \
                "decode's prompt tokens by source"
        elif share >= 0.9:
            out.verdict, out.verdict_source = NOT_CROSSED, "decode's prompt tokens by source"
    return out


def _decode_computed_share(link: LinkRecord) -> float | None:
    """The share of the decodes' prompt tokens they computed themselves (needs the link's
    `legs`; every decode leg of an XpYd split counts)."""
    urls = [u for role, u in (link.legs or {}).items() if leg_of(role)[0] == "decode"]
    found = [(d.get("prompt_tokens_local_compute"), d.get("prompt_tokens"))
             for u in urls if (d := link.metric_deltas.get(u)) is not None]
    pairs = [(float(c), float(t)) for c, t in found if c is not None and t is not None]
    total = sum(t for _, t in pairs)
    return sum(c for c, _ in pairs) / total if pairs and total else None


def _external_tokens(link: LinkRecord) -> float | None:
    """Prompt tokens the engines loaded through the connector during the run."""
    found = [float(loaded) for d in link.metric_deltas.values()
             if (loaded := d.get("prompt_tokens_external_kv_transfer")) is not None]
    return sum(found) if found else None


def _verdict(out: Bytes, iface_blind: bool = False) -> None:
    # NIXL's own count is the most specific; RDMA next; what decode read from a shared store
    # next, then the store's growth; the whole interface last
    sources = [s for s in ("nixl", "rdma", "store_read", "store", "iface") if s in out.observed
               and not (s == "iface" and iface_blind)]
    if out.predicted is None or not sources:
        return
    source = sources[0]
    share = out.observed[source] / out.predicted if out.predicted else 0.0
    out.verdict_source = source
    out.verdict = CROSSED if share >= 0.1 else NOT_CROSSED if share < 0.01 else UNCLEAR


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


def _pick(records: list[Record], disagg: str,
          baseline: str) -> tuple[dict[int, LoadRecord], dict[int, LoadRecord]]:
    """The newest run's rows, as the seed's compare-disagg.py takes them, whatever the tier
    size: the run just made is the one a user compares (the report keeps sizes apart)."""
    rows_d, rows_b = _paired(records, disagg, baseline)
    missing = [name for name, rows in ((disagg, rows_d), (baseline, rows_b)) if not rows]
    if missing:
        present = ", ".join(sorted({r.label for r in records if r.label}))
        raise InputError(f"No load-generator rows for label(s): {', '.join(missing)}. "
                         f"Labels present: {present}")
    if not set(rows_d) & set(rows_b):
        raise InputError(f"The two runs share no concurrency level, so nothing is comparable: "
                         f"{disagg} {sorted(rows_d)}, {baseline} {sorted(rows_b)}")
    return rows_d, rows_b


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
