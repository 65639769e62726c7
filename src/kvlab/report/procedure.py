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

from kvlab.records import (
    BOUNDARY,
    CANCEL,
    SPLIT,
    BoundaryRecord,
    CancelEvidence,
    Notebook,
    ProcedureRecord,
    Record,
)
from kvlab.report.common import Line, Table, crossing_words, measured_on, missing, num

COLUMNS = ["Result", "Figures"]
WIDTH = len(COLUMNS)
CLEAR = 0.10  # a boundary rests on ratios at least this far from 1 (there is no interval)


def procedure_table(book: Notebook) -> Table:
    table = Table("P/D lab: procedure steps", "Step", COLUMNS)
    table.lines.append(_cancel_row(book))
    table.lines += _boundary_rows(book)
    return table


def _on(book: Notebook, record: Record) -> str:
    """What the split measured on: its pair's startup lines are `disagg-prefill` and
    `disagg-decode`."""
    return measured_on(book, record.model_copy(update={"label": SPLIT.label}))


def _cancel_row(book: Notebook) -> Line:
    found = [r for r in book.of(ProcedureRecord, CANCEL.label) if r.step == CANCEL.label]
    if not found:
        return missing(CANCEL, book, WIDTH)
    r = found[-1]
    result = (f"pass: all {len(r.checks)} checks" if r.verdict == "pass"
              else f"FAIL: {', '.join(r.failed)}")
    figures = _cancel_figures(r.evidence)
    evidence = [*figures, *(f"{c.name} {'ok' if c.passed else 'FAILED'}: {c.detail}"
                            for c in r.checks)]
    return Line(CANCEL.title, CANCEL.how, [result, figures[0]], evidence, _on(book, r),
                "pass" if r.verdict == "pass" else "fail", CANCEL.command, anchor=CANCEL.label)


def _cancel_figures(ev: CancelEvidence | None) -> list[str]:
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
    return parts


def _boundary_rows(book: Notebook) -> list[Line]:
    newest: dict[int, BoundaryRecord] = {}
    for r in book.of(BoundaryRecord, BOUNDARY.label):
        newest[r.concurrency] = r
    if not newest:
        return [missing(BOUNDARY, book, WIDTH)]
    return [_boundary_row(book, newest[c]) for c in sorted(newest)]


def _boundary_row(book: Notebook, r: BoundaryRecord) -> Line:
    ratios = ", ".join(f"x{num(p.ratio, 2)} at {p.prompt_tokens_target}" for p in r.points)
    per_point = r.requests_per_point if r.requests_per_point is not None else "?"
    answer = r.max_tokens if r.max_tokens is not None else "?"
    evidence = [f"{p.prompt_tokens_target} tokens: split {num(p.split_ttft_p50_s)} s, "
                f"baseline {num(p.baseline_ttft_p50_s)} s" for p in r.points]
    evidence.append(f"{per_point} cold prompts per length and side, {answer} answer tokens "
                    "each; point ratios of medians, no interval (no per-request data)")
    moved = [f"{p.prompt_tokens_target}: {num(p.split_tokens_from_store, 0)}"
             for p in r.points if p.split_tokens_from_store is not None]
    if moved:
        evidence.append("prompt tokens decode took from the store, per request: "
                        + ", ".join(moved))
    evidence.append(f"as recorded: {r.statement}")
    result, verdict = boundary_result(r)
    return Line(f"{BOUNDARY.title} (concurrency {r.concurrency})", BOUNDARY.how,
                [result, f"split/baseline TTFT p50: {ratios}"], evidence, _on(book, r),
                verdict, BOUNDARY.command, anchor=f"{BOUNDARY.label}-c{r.concurrency}")


def boundary_result(r: BoundaryRecord) -> tuple[str, str]:
    """Where the split starts or stops paying, said only where the ratios on each side of the
    crossing are at least `CLEAR` from 1: they are point ratios with no interval."""
    ratios = [p.ratio for p in sorted(r.points, key=lambda p: p.prompt_tokens_target)
              if p.ratio is not None]
    if r.crossing_tokens is None or r.verdict not in ("pays-above", "pays-below"):
        return r.statement.split(":")[0], crossing_words(r.verdict)
    flip = next((i for i in range(len(ratios) - 1)
                 if (ratios[i] < 1.0) != (ratios[i + 1] < 1.0)), None)
    around = ratios[flip:flip + 2] if flip is not None else ratios
    near = [x for x in around if abs(x - 1.0) < CLEAR]
    if near:
        shown = ", ".join(f"x{x:.2f}" for x in near)
        return (f"no clear boundary: {shown} within {CLEAR:.0%} of 1, with no interval",
                "not shown")
    side = "above" if r.verdict == "pays-above" else "below"
    return (f"pays {side} about {r.crossing_tokens:,.0f} tokens (point ratios)",
            f"pays {side} {r.crossing_tokens:,.0f} tokens")
