"""`kvlab report`: the labs' "Expected outcome" tables and plots, from the notebook alone.

Every cell is a measured value or an explicit reason (a `not-run` line says why a row cannot
run on the machine that ran the lab); every row carries its evidence and what it was measured
on. The labs' closing decisions follow the tables (`decisions.py`), each with its figures or
"not enough evidence" and why. Ratios between runs carry 95% intervals drawn from the
per-request files the load rows name (`intervals.py`); a file whose sha256 differs from its
row's stops the report with one line, and files that are absent (a notebook copied without
its `kvlab-requests` folder) leave out what needs them, saying so. With a CSV folder, every
table and every run's requests are written as CSV too (`export.py`). No engine is touched:
the report runs anywhere the notebook is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.core import write_private
from kvlab.records import LoadRecord, notebook, requests
from kvlab.report import (
    console_engines,
    console_llama,
    console_load,
    console_plan,
    console_proxy,
    console_reuse,
    console_run,
)
from kvlab.report.common import Table
from kvlab.report.decisions import decide
from kvlab.report.decisions_common import Decision
from kvlab.report.html import page
from kvlab.report.llama import llama_lines
from kvlab.report.offload import offload_table
from kvlab.report.pd import pd_table
from kvlab.report.plots_figure import Plot
from kvlab.report.procedure import procedure_table
from kvlab.report.replicas import replicas_table
from kvlab.report.starts import latest as latest_starts

# what the CLI reads: the report, and the console's renderings of each command's results
__all__ = ["LAB_TITLES", "Report", "build", "console_engines", "console_llama", "console_load",
           "console_plan", "console_proxy", "console_reuse", "console_run", "write"]

LAB_TITLES = {"offload": "Offload lab, task 6 (three sentences: which tiers to keep)",
              "pd": "P/D lab (one sentence: which configuration you would actually use)"}


@dataclass
class Report:
    labbook: str
    tables: list[Table]
    plots: list[Plot] = field(default_factory=list)
    csv_files: list[Path] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # broken lines: number, why
    absent: list[str] = field(default_factory=list)  # per-request files not beside it
    decisions: list[Decision] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # experiments not run yet
    stopped: bool = False  # the run was cut (a signal, Ctrl-C): pending never will run
    starts: str = ""  # how much of the latest run went to engine starts (`starts.py`)
    charts: dict[str, Plot] = field(default_factory=dict)  # each decision's, by its question

    @property
    def title(self) -> str:
        return f"kvlab report from {self.labbook}"

    def markdown(self) -> str:
        parts = [f"# {self.title}", ""]
        if self.pending:
            parts += [f"({self.pending_line})", ""]
        if self.starts:
            parts += [self.starts, ""]
        for table in self.tables:
            parts += [table.markdown(), ""]
        if self.decisions:
            parts += ["### Decisions, from the rows above", ""]
            for lab, title in LAB_TITLES.items():
                answers = [d for d in self.decisions if d.lab == lab]
                parts += [f"{title}:", ""]
                for d in answers:
                    parts.append(f"- **{d.question}** {d.answer}"
                                 + (f" *Your answer:* {d.yours}" if d.yours else ""))
                    if (chart := self.charts.get(d.question)) is not None:
                        parts += ["", f"  ![its figures]({chart.path.name})"]
                parts.append("")
        if self.plots:
            parts += ["### Plots", ""]
            for p in self.plots:
                parts += [f"**{p.question}** {p.answer}", "", f"![{p.path.stem}]({p.path.name})",
                          ""]
        return "\n".join(parts + [f"({line})" for line in self.left_out()])

    @property
    def skipped_lines(self) -> int:
        return len(self.skipped)

    def left_out(self, most: int = 5) -> list[str]:
        """What the report could not use, with where: the broken lines by number (`most` of
        them), and the absent per-request files."""
        out = []
        if self.skipped:
            lines = "; ".join(f"line {n}: {why}" for n, why in self.skipped[:most])
            more = len(self.skipped) - most
            out.append(f"{len(self.skipped)} broken notebook lines were skipped: {lines}"
                       + (f"; and {more} more" if more > 0 else ""))
        if self.absent:
            out.append(f"{len(self.absent)} per-request files the notebook names are not beside "
                       f"it (first: {self.absent[0]}): the tables and decisions come from the "
                       "notebook alone; the intervals, plots and CSV files that need them are "
                       "left out")
        return out

    @property
    def pending_line(self) -> str:
        names = ", ".join(self.pending)
        if self.stopped:
            return ("The run was stopped before it finished: what it measured is below; "
                    f"cut short or not run: {names}.")
        return f"Written while the run goes on: not run yet: {names}."

    def html(self) -> str:
        return page(self.title, self.tables, self.decisions, self.plots,
                    self.pending_line if self.pending else "", self.starts, self.charts)

    def as_dict(self) -> dict[str, object]:
        return {"labbook": self.labbook, "skipped_lines": self.skipped_lines,
                "skipped": [{"line": n, "why": why} for n, why in self.skipped],
                "absent_requests_files": self.absent,
                "tables": [{"title": t.title, "columns": t.flat_header(), "rows": t.rows}
                           for t in self.tables],
                "decisions": [d.as_dict() for d in self.decisions],
                "plots": [{"file": str(p.path), "question": p.question, "answer": p.answer}
                          for p in self.plots],
                "csv": [str(p) for p in self.csv_files], "pending": self.pending,
                "starts": self.starts}


def build(labbook: str | Path, plots_dir: Path | None = None,
          csv_dir: Path | None = None) -> Report:
    """Both tables (and, with `plots_dir`, the plots; with `csv_dir`, the CSV files) from one
    notebook file."""
    book = notebook.read(labbook)
    # the procedure's table stays last (readers take it as the last)
    tables = [offload_table(book, llama_lines(book)), pd_table(book), replicas_table(book),
              procedure_table(book)]
    report = Report(str(labbook), tables,
                    skipped=list(book.broken), decisions=decide(book),
                    absent=requests.absent(book.path,
                                           (r.requests_file for r in book.of(LoadRecord))))
    if (starts := latest_starts(book)) is not None:
        report.starts = starts.sentence()
    if plots_dir is not None:
        from kvlab.report.plots import draw_all
        from kvlab.report.plots_decision import decision_plot

        report.plots = draw_all(book, plots_dir)
        report.charts = {d.question: chart for d in report.decisions
                         if (chart := decision_plot(d, plots_dir)) is not None}
    if csv_dir is not None:
        from kvlab.report.export import write_all

        report.csv_files = write_all(report.tables, report.decisions, book, csv_dir)
    return report


def write(labbook: str | Path, out_dir: Path, *, plots: bool = True,
          csv_dir: Path | None = None, pending: Sequence[str] = (),
          stopped: bool = False) -> Report:
    """The report (with its plots unless `plots` is false, and CSV files in `csv_dir`),
    written as `out_dir`/report.md and `out_dir`/report.html, each whole or not at all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = build(labbook, out_dir if plots else None, csv_dir)
    report.pending, report.stopped = list(pending), stopped
    write_private(out_dir / "report.md", report.markdown() + "\n")
    write_private(out_dir / "report.html", report.html() + "\n")
    return report
