"""`kvlab report`: the labs' decisions, tables and plots as one self-contained page
(report.html) and as markdown with PNG plots (report.md); with `--csv DIR`, the tables and
per-request data as CSV, from the notebook and the per-request files it names."""

from __future__ import annotations

from pathlib import Path

import click

from kvlab.cli.common import Output, json_option, settings_from


@click.command("report")
@click.option("--labbook", help="Notebook to read (default: LABBOOK).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("kvlab-report"), show_default=True,
              help="Directory for report.html, report.md and the plots.")
@click.option("--no-plots", is_flag=True, help="Tables only.")
@click.option("--csv", "csv_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write every table and each run's per-request data as CSV files here.")
@json_option
@click.pass_context
def report_command(ctx: click.Context, labbook: str | None, out_dir: Path, no_plots: bool,
                   csv_dir: Path | None, as_json: bool) -> None:
    """Fill the labs' "Expected outcome" tables from the notebook, with evidence."""
    from kvlab.report import write

    settings = settings_from(ctx, labbook=labbook).values
    report = write(settings.labbook, out_dir, plots=not no_plots, csv_dir=csv_dir)
    text = report.markdown()
    data = {**report.as_dict(), "written": str(out_dir / "report.md"),
            "page": str(out_dir / "report.html")}
    where = f"\n(written to {out_dir}/report.html and report.md" + (
        f"; {len(report.csv_files)} CSV files in {csv_dir}" if csv_dir is not None else "") + ")"
    out = Output(as_json)
    for line in report.left_out(most=20):  # on stderr: the report itself is on stdout
        out.err.print(f"kvlab: {settings.labbook}: {line}")
    out.result(data, lambda c: c.print(text + where))


COMMANDS = (report_command,)
