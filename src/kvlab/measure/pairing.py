"""Which load rows a comparison sets side by side: the seed's compare-disagg.py pairing.

For one label, the most recent load row per concurrency level; for two labels, both sides
from the newest `kvlab run` that measured both (one run_id), so that a later or an older run of
one side is never paired with it; for the host tier's pair, the newest run whose tier could
hold its working set (or, asked, the newest whose could not). Also the most recent `link`
record of a label. `_pick` is `compare_runs`'s choice: the newest run's rows, refused when
a side has none or the two share no level.

Deliberately not here: whether two runs are the same experiment (`same_experiment.py`), the
bytes that crossed the link (`link_bytes.py`), and the table, pressure and record of a
comparison and reading the notebook (`compare.py`). Pure functions of the notebook's records.
"""

from __future__ import annotations

from kvlab.core import InputError, connectors
from kvlab.measure.pressure import tier_too_small
from kvlab.records import PRESSURE_OFF, PRESSURE_ON, LinkRecord, LoadRecord, Record

OFFLOAD_ON, OFFLOAD_OFF = PRESSURE_ON.label, PRESSURE_OFF.label


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


def tier_pair(records: list[Record], *, smaller_tier: bool = False,
              backend: str | None = None
              ) -> tuple[dict[int, LoadRecord], dict[int, LoadRecord]]:
    """The host tier's (on, off) pair from the newest run whose tier could hold its working set
    (or did not record whether), or with `smaller_tier` the newest whose tier could not: a
    run with `--tier-gb` below the working set never stands in for one that held it. With
    `backend`, the newest run of that backend's tier (KV_OFFLOAD_BACKEND, as its rows say)."""
    def other_kind(r: Record) -> bool:
        return (isinstance(r, LoadRecord) and r.label == OFFLOAD_ON
                and (tier_too_small(r) != smaller_tier
                     or (backend is not None and connectors.tier_backend(r.tier) != backend)))
    runs = {r.run_id for r in records if other_kind(r) and r.run_id is not None}
    kept = [r for r in records if r.run_id not in runs and not other_kind(r)]
    on, off = _paired(kept, OFFLOAD_ON, OFFLOAD_OFF)
    if smaller_tier and not on:  # a tier-off run alone is no smaller-tier experiment
        return {}, {}
    return on, off


def tier_backends(records: list[Record]) -> list[str]:
    """The host-tier backends the tier-on pressure rows name, newest first."""
    said = (connectors.tier_backend(r.tier) for r in reversed(records)
            if isinstance(r, LoadRecord) and r.label == OFFLOAD_ON)
    return [b for b in dict.fromkeys(said) if b is not None]


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
