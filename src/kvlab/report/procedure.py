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

from kvlab.records.models import BoundaryRecord, ProcedureRecord, Record
from kvlab.records.notebook import Notebook
from kvlab.records.rows import BOUNDARY, CANCEL, SPLIT
from kvlab.records.runs import CancelEvidence
from kvlab.report.common import Table, measured_on, missing, num

COLUMNS = ["Step", "Command", "Result", "Figures", "Evidence", "Measured on"]
CANCEL_HOW = "kvlab run disagg --part cancel"
BOUNDARY_HOW = "kvlab run disagg --part boundary"


def procedure_table(book: Notebook) -> Table:
    table = Table("P/D lab: procedure steps", COLUMNS)
    table.rows.append(_cancel_row(book))
    table.rows += _boundary_rows(book)
    return table


def _on(book: Notebook, record: Record) -> str:
    """What the split measured on: its pair's startup lines are `disagg-prefill` and
    `disagg-decode`."""
    return measured_on(book, record.model_copy(update={"label": SPLIT.label}))


def _cancel_row(book: Notebook) -> list[str]:
    found = [r for r in book.of(ProcedureRecord, CANCEL.label) if r.step == CANCEL.label]
    if not found:
        return missing(CANCEL.title, CANCEL_HOW, book, CANCEL.label, len(COLUMNS) - 2)
    r = found[-1]
    result = (f"pass: all {len(r.checks)} checks" if r.verdict == "pass"
              else f"FAIL: {', '.join(r.failed)}")
    evidence = "; ".join(f"{c.name} {'ok' if c.passed else 'FAILED'}: {c.detail}"
                         for c in r.checks)
    return [CANCEL.title, CANCEL_HOW, result, _cancel_figures(r.evidence), evidence,
            _on(book, r)]


def _cancel_figures(ev: CancelEvidence | None) -> str:
    cut = ev.cut if ev is not None else None
    spec = ev.spec if ev is not None else None
    prompt = spec.prompt_tokens if spec is not None else None
    parts = [f"cut after {cut.tokens if cut is not None else 'n/a'} tokens of a "
             f"{prompt if prompt is not None else '?'}-token prompt "
             f"({num(cut.closed_after_s if cut is not None else None, 2)} s)"]
    if ev is not None and ev.settled_s is not None:
        parts.append(f"proxy and decode let go in {num(ev.settled_s, 2)} s")
    if ev is not None and ev.restart.ok:
        parts.append(f"decode stopped in {num(ev.restart.stop_s, 1)} s, ready again in "
                     f"{num(ev.restart.ready_s, 1)} s")
    else:
        parts.append("decode did not come back")
    fresh = ev.fresh.completion_tokens if ev is not None else None
    parts.append(f"fresh request {fresh if fresh is not None else 'n/a'}/"
                 f"{ev.expected_tokens if ev is not None else '?'} tokens")
    return "; ".join(parts)


def _boundary_rows(book: Notebook) -> list[list[str]]:
    newest: dict[int, BoundaryRecord] = {}
    for r in book.of(BoundaryRecord, BOUNDARY.label):
        newest[r.concurrency] = r
    if not newest:
        return [missing(BOUNDARY.title, BOUNDARY_HOW, book, BOUNDARY.label, len(COLUMNS) - 2)]
    return [_boundary_row(book, newest[c]) for c in sorted(newest)]


def _boundary_row(book: Notebook, r: BoundaryRecord) -> list[str]:
    ratios = ", ".join(f"{p.prompt_tokens_target}: x{num(p.ratio, 2)}" for p in r.points)
    ttfts = "; ".join(f"{p.prompt_tokens_target} tokens: split "
                      f"{num(p.split_ttft_p50_s)} s, baseline "
                      f"{num(p.baseline_ttft_p50_s)} s" for p in r.points)
    per_point = r.requests_per_point if r.requests_per_point is not None else "?"
    answer = r.max_tokens if r.max_tokens is not None else "?"
    evidence = (f"TTFT p50 {ttfts}; {per_point} cold prompts per length "
                f"and side, {answer} answer tokens each")
    moved = [f"{p.prompt_tokens_target}: {num(p.split_tokens_from_store, 0)}"
             for p in r.points if p.split_tokens_from_store is not None]
    if moved:
        evidence += "; prompt tokens decode took from the store, per request: " + ", ".join(moved)
    return [f"{BOUNDARY.title} (concurrency {r.concurrency})", BOUNDARY_HOW, r.statement,
            f"split/baseline TTFT p50 by prompt tokens: {ratios}", evidence, _on(book, r)]
