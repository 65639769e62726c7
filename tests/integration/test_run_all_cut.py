"""A `kvlab run all` cut by a time limit's SIGTERM in the middle of its pass still leaves a
report of what ran, names what did not, and leaves no engine behind.

Real llama-server (the first two llama.cpp experiments, seconds each); the signal is sent
once the first experiment's line is in the notebook, while the second one runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab.engines.ports import port_in_use
from kvlab.records import notebook
from kvlab.records.models import DiskRecord, StartupRecord

pytestmark = pytest.mark.llama


def _wait_for(book: Path, text: str, proc: subprocess.Popen[str], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        if book.is_file() and text in book.read_text(encoding="utf-8"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never reached {book} (exit {proc.poll()})")


def test_a_run_cut_by_sigterm_leaves_a_report_of_what_ran(
        tmp_path: Path, llama_binary: Path) -> None:
    book, where = tmp_path / "labbook.md", tmp_path / "report"
    env = {**os.environ, "LABBOOK": str(book), "LLAMA_BIN": str(llama_binary.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "kvlab", "run", "all", "--quick",
                             "--only", "disk", "--only", "interference", "--report-dir",
                             str(where)], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(book, '"label": "interference-parallel-4"', proc, 300)  # its engine is up
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-2000:]
    assert "stopped: the report of what ran is in" in out, out[-2000:]

    report = (where / "report.md").read_text(encoding="utf-8")
    assert "The run was stopped before it finished" in report
    assert "cut short or not run: interference." in report
    assert "Written while the run goes on" not in report  # it is not going on
    disk = next(ln for ln in report.splitlines() if ln.startswith("| Disk, llama.cpp slot"))
    assert "not run" not in disk and "not measured" not in disk, disk
    read = notebook.read(book)
    assert read.of(DiskRecord, "disk")
    ports = [int(r.argv[r.argv.index("--port") + 1]) for r in read.of(StartupRecord)]
    assert ports and not any(port_in_use("127.0.0.1", p) for p in ports)  # nothing left up
