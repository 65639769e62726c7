"""`kvlab report`: the labs' "Expected outcome" tables and plots, from the notebook alone.

Every cell is a measured value or an explicit reason (a `not-run` line says why a row cannot
run on the machine that ran the lab); every row carries its evidence and what it was measured
on. No engine is touched: the report runs anywhere the notebook file is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvlab.records import notebook
from kvlab.report.common import Table
from kvlab.report.offload import offload_table
from kvlab.report.pd import pd_table


@dataclass
class Report:
    labbook: str
    tables: list[Table]
    plots: list[Path] = field(default_factory=list)
    skipped_lines: int = 0

    def markdown(self) -> str:
        parts = [f"# kvlab report from {self.labbook}", ""]
        for table in self.tables:
            parts += [table.markdown(), ""]
        if self.plots:
            parts += ["### Plots", ""] + [f"![{p.stem}]({p.name})" for p in self.plots] + [""]
        if self.skipped_lines:
            parts.append(f"({self.skipped_lines} broken notebook lines were skipped.)")
        return "\n".join(parts)

    def as_dict(self) -> dict[str, object]:
        return {"labbook": self.labbook, "skipped_lines": self.skipped_lines,
                "tables": [{"title": t.title, "columns": t.columns, "rows": t.rows}
                           for t in self.tables],
                "plots": [str(p) for p in self.plots]}


def build(labbook: str | Path, plots_dir: Path | None = None) -> Report:
    """Both tables (and, with `plots_dir`, the plots) from one notebook file."""
    book = notebook.read(labbook)
    report = Report(str(labbook), [offload_table(book), pd_table(book)],
                    skipped_lines=book.broken_lines)
    if plots_dir is not None:
        from kvlab.report.plots import draw_all

        report.plots = draw_all(book, plots_dir)
    return report
