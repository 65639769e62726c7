"""`report.html` as a reader meets it, in a real headless Chromium: the committed notebooks'
reports (the H200 runs, the CPU demo) load with no console error and no broken image, every
plot has data, the decisions fit the first screen at 1280x800, every decided answer has its
chart beside it, no table cell runs past 120 characters, no word of a plot runs past its
figure's edge or over another word, and nothing is fetched from the network. Printed on A4,
every row's evidence and every decision's whole answer shows and no word of a plot is smaller
than 7 pt. A `kvlab run all` cut after its first experiment leaves a report of that
experiment.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import children
from integration.page import check, printed
from kvlab.report import write
from kvlab.report.common import CELL_LIMIT

DOCS = Path(__file__).resolve().parents[3] / "docs"
NOTEBOOKS = {"h200-redo": DOCS / "validation" / "h200-redo" / "notebook.jsonl",
             "h200-x2-ray": DOCS / "validation" / "h200-x2-ray" / "notebook.jsonl",
             "h200-oracle": DOCS / "validation" / "h200-oracle" / "notebook.jsonl",
             "h200-quick": DOCS / "validation" / "h200-run-all" / "quick-2026-12-07"
             / "notebook.jsonl",
             "h200-tier-sizes": DOCS / "validation" / "h200-tier-sizes" / "notebook.jsonl",
             "cpu-demo": DOCS / "examples" / "cpu-demo" / "notebook.jsonl"}


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_a_committed_report_reads_at_a_glance(name: str, tmp_path: Path) -> None:
    source = NOTEBOOKS[name]
    copy = tmp_path / "book"
    shutil.copytree(source.parent, copy, ignore=shutil.ignore_patterns("*.png", "*.html"))
    report = write(copy / source.name, tmp_path / "report")
    assert report.plots, "the notebook has data for plots"
    shot = os.environ.get("KVLAB_SCREENSHOTS")  # where to keep the first screens, if set
    seen = check(tmp_path / "report" / "report.html",
                 Path(shot) / f"report-{name}.png" if shot else None)
    assert seen.errors == [] and seen.broken_images == 0 and seen.external == []
    assert len(seen.plots) == len(report.plots)
    assert all(p["svg"] and int(str(p["marks"])) > 0 for p in seen.plots), seen.plots
    assert seen.decisions == len(report.decisions) > 0
    assert seen.decisions_bottom is not None and seen.decisions_bottom <= 800
    assert len(seen.longest_cell) <= CELL_LIMIT, seen.longest_cell
    assert seen.outside == [], seen.outside  # no word cut at a figure's edge
    assert seen.overlaps == [], seen.overlaps  # nor drawn over another
    # every decided answer has its chart beside it, with the figures drawn
    assert all(int(str(w["chart"])) == 1 and int(str(w["marks"])) > 0
               for w in seen.ways if w["way"] != "open"), seen.ways
    assert sum(int(str(w["chart"])) for w in seen.ways) == len(report.charts)
    paper = printed(tmp_path / "report" / "report.html")
    assert paper.hidden == 0 and paper.closed_at_print == 0, paper
    assert paper.shown == paper.items > 0, paper  # every evidence row, every whole answer
    assert paper.smallest_pt >= 7, paper


def test_a_run_all_cut_after_its_first_experiment_leaves_its_report(
        tmp_path: Path, llama_binary: Path) -> None:
    """SIGTERM (what `timeout` sends) after the disk experiment: the report holds the disk
    row, says which experiments had not run, and the page reads in the browser."""
    book, out = tmp_path / "labbook.md", tmp_path / "report"
    env = {**os.environ, "LABBOOK": str(book)}
    child = children.spawn(
        [sys.executable, "-m", "kvlab", "run", "all", "--quick", "--only", "disk",
         "--only", "interference", "--report-dir", str(out), "--json"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        said = []
        for line in child.stderr:
            said.append(line)
            if "report so far in" in line:
                break
        assert any("not run yet: interference" in s for s in said), "".join(said)[-3000:]
        time.sleep(1.0)  # interference is starting its engine
        child.send_signal(signal.SIGTERM)
        rest = child.communicate(timeout=120)[1]
    finally:
        children.stop(child, None)
    assert child.returncode != 0
    assert "stopped: the report of what ran is in" in rest, rest[-2000:]
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "The run was stopped before it finished" in text
    assert "cut short or not run: interference." in text
    disk = next(line for line in text.splitlines() if line.startswith("| Disk, llama.cpp"))
    assert "(after restore)" in disk and "not measured" not in disk, disk
    seen = check(out / "report.html")
    assert seen.errors == [] and seen.decisions > 0
