"""The report's sentence on engine starts, from the committed CPU demo's notebook (27 fresh
starts) and the same run with one of its engines kept instead of started."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvlab.records import notebook
from kvlab.records.runs import EngineReuse, ResetProbe, StartupRecord
from kvlab.report import build
from kvlab.report.starts import latest

DEMO = Path(__file__).parents[2] / "docs" / "examples" / "cpu-demo" / "notebook.jsonl"


def test_the_demo_runs_starts_against_its_span() -> None:
    found = latest(notebook.read(DEMO))
    assert found is not None and found.run_id == "20261202-004447"
    assert found.starts == 27 and found.kept == 0
    assert 250 < found.start_s < 300 and 600 < found.span_s < 700
    assert found.sentence().startswith("Engine starts in run 20261202-004447: 27 start(s) took "
                                       "4 min 33 s of its 11 min 6 s (41%)")


def test_a_kept_engine_counts_its_reset_and_says_what_it_saved(tmp_path: Path) -> None:
    book = tmp_path / "book.jsonl"
    book.write_text(DEMO.read_text(encoding="utf-8"), encoding="utf-8")
    shutil.copytree(DEMO.parent / "kvlab-requests", tmp_path / "kvlab-requests")
    first = next(r for r in notebook.read(DEMO).of(StartupRecord) if r.label == "disk")
    kept = first.model_copy(update={"label": "shared-slots-a", "ready_s": 0.2, "reused": (
        EngineReuse(started_as="disk", start_ready_s=first.ready_s, probe=ResetProbe(
            method="POST /slots/ID?action=erase, each of 2 slot(s)", prompt_tokens=500,
            cached_before=499, cached_after=0, reset_s=0.2)))})
    notebook.append(book, kept)
    found = latest(notebook.read(book))
    assert found is not None and (found.starts, found.kept) == (27, 1)
    assert found.saved_s == first.ready_s and found.reset_s == 0.2
    assert "1 engine(s) kept from the previous step and reset instead" in found.sentence()
    assert found.sentence() in build(book).markdown()


def test_engines_started_together_count_their_longest_start_once(tmp_path: Path) -> None:
    book = tmp_path / "book.jsonl"
    book.write_text(DEMO.read_text(encoding="utf-8"), encoding="utf-8")
    before = latest(notebook.read(book))
    assert before is not None
    first = next(r for r in notebook.read(DEMO).of(StartupRecord) if r.label == "disk")
    for label, ready in (("offload-off", 60.0), ("offload-on", 75.0), ("offload-off-load", 50.0)):
        notebook.append(book, first.model_copy(update={"label": label, "ready_s": ready,
                                                       "start_batch": "b1"}))
    found = latest(notebook.read(book))
    assert found is not None and found.starts == before.starts + 3
    assert found.start_s == before.start_s + 75.0  # one batch: its longest, not 185 s
    assert (found.together, found.batches) == (3, 1)
    assert "(3 of them together, in 1 batch(es) counted once each)" in found.sentence()
