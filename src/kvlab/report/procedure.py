"""The P/D lab's procedure steps as report rows, from the notebook alone.

- "A request cancelled mid-stream, then the decode worker restarted": the newest `procedure`
  line of step cancel-restart, its verdict (the failed checks named), the figures that matter
  and every check with its own figures.
- "Long against short prompts": the newest `boundary` line per concurrency, its statement
  (where the split's TTFT ratio against the baseline crosses 1.0, or that it does not) and
  the ratio and both TTFTs at every length.
A step with no line says how to get one, or why it could not run (a `not-run` line).
"""

from __future__ import annotations

from typing import Any

from kvlab.experiments import BOUNDARY_ROW, CANCEL_ROW
from kvlab.records.models import BoundaryRecord, ProcedureRecord, Record
from kvlab.records.notebook import Notebook
from kvlab.report.common import Table, measured_on, missing, num

COLUMNS = ["Step", "Command", "Result", "Figures", "Evidence", "Measured on"]
CANCEL_HOW = "kvlab run disagg --part cancel"
BOUNDARY_HOW = "kvlab run disagg --part boundary"
SPLIT_LABEL = "disagg"  # the pair's startup lines are disagg-prefill and disagg-decode


def procedure_table(book: Notebook) -> Table:
    table = Table("P/D lab: procedure steps", COLUMNS)
    table.rows.append(_cancel_row(book))
    table.rows += _boundary_rows(book)
    return table


def _on(book: Notebook, record: Record) -> str:
    return measured_on(book, record.with_fields(label=SPLIT_LABEL))


def _cancel_row(book: Notebook) -> list[str]:
    found = [r for r in book.of(ProcedureRecord, "cancel-restart") if r.step == "cancel-restart"]
    if not found:
        return missing(CANCEL_ROW, CANCEL_HOW, book, "cancel-restart", len(COLUMNS) - 2)
    r = found[-1]
    result = (f"pass: all {len(r.checks)} checks" if r.verdict == "pass"
              else f"FAIL: {', '.join(r.failed)}")
    evidence = "; ".join(f"{c.get('name')} {'ok' if c.get('passed') else 'FAILED'}: "
                         f"{c.get('detail')}" for c in r.checks)
    return [CANCEL_ROW, CANCEL_HOW, result, _cancel_figures(r.evidence), evidence,
            _on(book, r)]


def _cancel_figures(ev: dict[str, Any]) -> str:
    cut, restart, fresh = ev.get("cut") or {}, ev.get("restart") or {}, ev.get("fresh") or {}
    spec = ev.get("spec") or {}
    parts = [f"cut after {cut.get('tokens', 'n/a')} tokens of a {spec.get('prompt_tokens', '?')}"
             f"-token prompt ({num(cut.get('closed_after_s'), 2)} s)"]
    if ev.get("settled_s") is not None:
        parts.append(f"proxy and decode let go in {num(ev['settled_s'], 2)} s")
    if restart.get("ok"):
        parts.append(f"decode stopped in {num(restart.get('stop_s'), 1)} s, ready again in "
                     f"{num(restart.get('ready_s'), 1)} s")
    else:
        parts.append("decode did not come back")
    parts.append(f"fresh request {fresh.get('completion_tokens', 'n/a')}/"
                 f"{ev.get('expected_tokens', '?')} tokens")
    return "; ".join(parts)


def _boundary_rows(book: Notebook) -> list[list[str]]:
    newest: dict[int, BoundaryRecord] = {}
    for r in book.of(BoundaryRecord, "boundary"):
        newest[r.concurrency] = r
    if not newest:
        return [missing(BOUNDARY_ROW, BOUNDARY_HOW, book, "boundary", len(COLUMNS) - 2)]
    return [_boundary_row(book, newest[c]) for c in sorted(newest)]


def _boundary_row(book: Notebook, r: BoundaryRecord) -> list[str]:
    ratios = ", ".join(f"{p.get('prompt_tokens_target')}: x{num(p.get('ratio'), 2)}"
                       for p in r.points)
    ttfts = "; ".join(f"{p.get('prompt_tokens_target')} tokens: split "
                      f"{num(p.get('split_ttft_p50_s'))} s, baseline "
                      f"{num(p.get('baseline_ttft_p50_s'))} s" for p in r.points)
    evidence = (f"TTFT p50 {ttfts}; {r.get('requests_per_point', '?')} cold prompts per length "
                f"and side, {r.get('max_tokens', '?')} answer tokens each")
    moved = [f"{p.get('prompt_tokens_target')}: {num(p['split_tokens_from_store'], 0)}"
             for p in r.points if p.get("split_tokens_from_store") is not None]
    if moved:
        evidence += "; prompt tokens decode took from the store, per request: " + ", ".join(moved)
    return [f"{BOUNDARY_ROW} (concurrency {r.concurrency})", BOUNDARY_HOW, r.statement,
            f"split/baseline TTFT p50 by prompt tokens: {ratios}", evidence, _on(book, r)]
