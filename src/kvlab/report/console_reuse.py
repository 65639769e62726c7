"""What `kvlab reuse`, `kvlab prove`, `kvlab predict` and `kvlab check` print, for a person at a
terminal.

A conversation's turns against turn 1 with each engine's hits, a proof's cases against what
was expected, the KV arithmetic's bytes and predictions, and two instances' compared fields
side by side with their mismatches. A figure that was not recorded reads "" or "n/a", never
"None".

It renders those four commands' results only; the reuse runs an experiment writes (the shared
slots) are `console_llama.py`'s. Nothing here measures, reads the notebook, or decides.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvlab.core import human_bytes
from kvlab.measure import Compatibility, compat
from kvlab.observe import fingerprint
from kvlab.records import KvPrediction, ProofRecord, ReuseRecord, ReuseSummary


def reuse(console: Console, record: ReuseRecord, written: str | None) -> None:
    """A conversation's turns: turn 1 against the fastest later one, each engine's hits, and
    whether the later turns reused; `written`: the notebook it went to (None: print only)."""
    s = record.summary or ReuseSummary()
    if s.turn1_ttft_s and s.best_later_ttft_s:
        console.print(f"\n    turn 1 time to first token   {s.turn1_ttft_s:.3f} s")
        console.print(f"    fastest later turn           {s.best_later_ttft_s:.3f} s "
                      f"({s.best_later_ratio or 0:.2f}x of turn 1)")
    for url, deltas in record.metric_deltas.items():
        hits, queries = deltas.get("prefix_cache_hits"), deltas.get("prefix_cache_queries")
        if hits is not None and queries:
            console.print(f"    {url}: prefix cache {hits:.0f} hit tokens of {queries:.0f} "
                          f"queried, {hits / queries * 100:.1f}%")
        if external := deltas.get("external_prefix_cache_hits"):
            console.print(f"    {url}: external (connector) hits {external:.0f} tokens")
    reused, later = s.reused_turns, len(s.later_turn_verdicts)
    if reused == later:
        console.print(f"    every later turn reused the conversation so far ({reused}/{later})")
    elif reused == 0:
        console.print("    NO later turn reused anything: every turn was prefilled from scratch")
    else:
        console.print(f"    {reused} of {later} later turns reused; see each turn's verdict")
    trap = next((r for reasons in record.turn_reasons for r in reasons
                 if "ExampleConnector" in r), None)
    if trap:
        console.print(f"    note: {trap}")
    console.print(f"\n    Appended one reuse line to {written}" if written
                  else "\n    --print-only: nothing written.")


def proof(console: Console, record: ProofRecord) -> None:
    """Each case's verdict against what was expected and observed, then the reasons."""
    table = Table("case", "verdict", "expected", "observed", "TTFT x cold", box=None)
    for case in record.cases:
        ev = case.evidence
        table.add_row(case.case, str(case.verdict or "-"),
                      _said(ev.expected_tokens if ev else None),
                      _said(ev.observed_tokens if ev else None),
                      _said(ev.ttft_ratio if ev else None))
    console.print(table)
    for case in record.cases:
        if case.verdict not in (None, "reused", "no-reuse-expected"):
            console.print(f"  {case.case}: " + "; ".join(case.reasons))
    for line in record.explanations:
        console.print(f"  {line}")


def _said(value: float | None) -> str:
    return "" if value is None else str(value)


def prediction(console: Console, r: KvPrediction, written: str | None) -> None:
    """The KV arithmetic: bytes per token, payload, transfer, concurrency."""
    console.print(f"==> KV arithmetic for {r.source}")
    console.print(f"    shape             {r.layers} layers x {r.kv_heads} KV heads x "
                  f"{r.head_dim} head dim x 2 (K and V), {r.dtype}")
    console.print(f"    bytes per token   {r.bytes_per_token or 0:,.0f}")
    if r.payload_bytes is not None:
        console.print(f"    payload           {human_bytes(r.payload_bytes)} for "
                      f"{r.prompt_tokens or 0:,} tokens ({r.payload_bytes:,.0f} B)")
        aligned = human_bytes(r.payload_bytes_block_aligned or 0)
        console.print(f"    block-aligned     {aligned} at {r.block_size}-token blocks")
    if r.transfer_s is not None:
        console.print(f"    transfer time     {r.transfer_s:.3f} s on "
                      f"{human_bytes(r.link_bytes_per_s or 0)}/s")
        console.print(f"    TTFT prediction   {r.ttft_prediction}")
    if r.max_concurrency is not None:
        console.print(f"    max concurrency   {r.max_concurrency:.2f} sequences of "
                      f"{r.ctx or 0:,} tokens in {r.kv_cache_tokens or 0:,} cached tokens")
    if written:
        console.print(f"    appended one prediction line to {written}")


def compatibility(console: Console, result: Compatibility) -> None:
    """`kvlab check`: every compared field side by side, the notes, the mismatches."""
    facts = [f.as_record() for f in result.instances]
    table = Table("field", *[f.url for f in facts], box=None)
    for name in (*compat.COMPARED, *compat.COMPARED_WHERE_KNOWN, *compat.NOTED):
        table.add_row(name, *[str(getattr(f, name)) for f in facts])
    table.add_row(compat.FINGERPRINT, *[
        " ".join(repr(t) for t in (f.fingerprint.chosen if f.fingerprint else []))
        or "no logprobs" for f in facts])
    console.print(table)
    for line in result.notes:
        console.print(f"note: {line}")
    for mismatch in result.mismatches:
        console.print(f"MISMATCH: {mismatch.message()}")
    for fault in result.store_faults:
        console.print(f"STORE: {fault}")
    if result.compatible:
        console.print("compatible: every compared field agrees, and so do the numbers "
                      f"(fingerprint within {fingerprint.TOLERANCE:.0e})")
