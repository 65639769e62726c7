"""`kvlab note`: the user's own answers beside kvlab's drafted ones, and free text that would
carry a key refused before anything runs or is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvlab.records import notebook
from kvlab.records.notes import NoteRecord
from kvlab.report import build

KEY = "sk-" + "abcdef0123456789" * 2


def kvlab(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVLAB_HOME": str(tmp_path / "home"),
           "LABBOOK": str(tmp_path / "labbook.md")}
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, check=False, timeout=120)


def test_a_note_is_a_line_and_the_report_shows_it_beside_the_draft(tmp_path: Path) -> None:
    done = kvlab(tmp_path, "note", "--about", "host-tier", "Keep", "the", "RAM", "cache.")
    assert done.returncode == 0, done.stderr
    later = kvlab(tmp_path, "note", "--about", "host-tier", "Keep a 4 GiB tier.")
    assert later.returncode == 0, later.stderr
    book = notebook.read(tmp_path / "labbook.md")
    assert [n.text for n in book.of(NoteRecord)] == ["Keep the RAM cache.", "Keep a 4 GiB tier."]
    report = build(tmp_path / "labbook.md")
    host = next(d for d in report.decisions if d.question == "Did the host tier pay?")
    assert host.yours == "Keep a 4 GiB tier." and not host.decided  # the newest note
    assert "*Your answer:* Keep a 4 GiB tier." in report.markdown()
    assert "Your answer: Keep a 4 GiB tier." in report.html()


def test_a_note_about_no_question_or_with_a_key_is_refused_and_nothing_written(
        tmp_path: Path) -> None:
    wrong = kvlab(tmp_path, "note", "--about", "weather", "sunny")
    assert wrong.returncode == 2 and "--about" in wrong.stderr
    secret = kvlab(tmp_path, "note", "--about", "disk", f"my key {KEY}")
    assert secret.returncode == 2 and "nothing was written" in secret.stderr
    assert KEY not in secret.stderr and "Traceback" not in secret.stderr
    assert not (tmp_path / "labbook.md").exists()


def test_a_runs_note_with_a_key_is_refused_before_the_run(tmp_path: Path) -> None:
    # the notebook would refuse the line after the run, losing it: refused first instead
    found = kvlab(tmp_path, "reuse", "--base-url", "http://127.0.0.1:9/v1", "--note", KEY)
    assert found.returncode == 2 and "--note" in found.stderr
    assert "did not answer" not in found.stderr and "Traceback" not in found.stderr
    assert KEY not in found.stderr
