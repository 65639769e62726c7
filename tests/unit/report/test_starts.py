"""The report's sentence on engine starts, from the committed CPU demo's notebook (27 fresh
starts) and the same run with one of its engines kept instead of started."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvlab.records import notebook
from kvlab.records.startup import EngineReuse, ResetProbe, StartupRecord
from kvlab.report import build
from kvlab.report.starts import latest

DEMO = Path(__file__).parents[3] / "docs" / "examples" / "cpu-demo" / "notebook.jsonl"


def test_the_demo_runs_starts_against_its_span() -> None:
    found = latest(notebook.read(DEMO))
    assert found is not None and found.run_id == "20261202-004447"
    assert found.starts == 27 and found.kept == 0
    # 273 s summed; its pairs (shared-store, the split) started together and overlap
    assert 200 < found.start_s < 215 and 600 < found.span_s < 700
    assert found.sentence().startswith("Engine starts in run 20261202-004447: 27 start(s) took "
                                       "3 min 27 s of its 11 min 6 s (31%)")


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


def test_starts_that_overlap_count_their_time_once(tmp_path: Path) -> None:
    book = tmp_path / "book.jsonl"
    book.write_text(DEMO.read_text(encoding="utf-8"), encoding="utf-8")
    before = latest(notebook.read(book))
    assert before is not None
    first = next(r for r in notebook.read(DEMO).of(StartupRecord) if r.label == "disk")
    # two batches of one experiment, as run all's offload starts them on a GPU: the tier-on
    # pair launched 21 s after the tier-off pair (its plans read vLLM's flags), both ready at
    # about the same time; then a later engine alone
    lines = (("offload-off", 88.0, "b1", "2026-12-02T18:30:00+00:00"),
             ("offload-off-load", 88.0, "b1", "2026-12-02T18:30:00+00:00"),
             ("offload-on", 67.0, "b2", "2026-12-02T18:30:00.500000+00:00"),
             ("offload-on-load", 67.0, "b2", "2026-12-02T18:30:00.500000+00:00"),
             ("shared-a", 50.0, None, "2026-12-02T18:35:00+00:00"))
    for label, ready, batch, at in lines:
        notebook.append(book, first.model_copy(update={"label": label, "ready_s": ready,
                                                       "start_batch": batch,
                                                       "recorded_at": at}))
    found = latest(notebook.read(book))
    assert found is not None and found.starts == before.starts + 5
    assert found.start_s == pytest.approx(before.start_s + 88.5 + 50.0)  # not 410 s
    assert (found.together, found.batches) == (4, 2)
    assert "(4 of them together, in 2 batch(es); time that starts overlap counts once)" \
        in found.sentence()


def test_a_run_that_opens_with_a_start_counts_the_launch_in_its_span(tmp_path: Path) -> None:
    # the together lab's first line is a startup line written when its engines were ready, 24 s
    # after launch; its span must not be the 4 s from that line to the last (600% in starts)
    book = tmp_path / "book.jsonl"
    first = next(r for r in notebook.read(DEMO).of(StartupRecord) if r.label == "disk")
    for label, at in (("a", "2026-12-02T22:19:24+00:00"), ("b", "2026-12-02T22:19:28+00:00")):
        notebook.append(book, first.model_copy(update={
            "label": label, "ready_s": 23.98, "start_batch": "b1", "recorded_at": at,
            "run_id": "r1"}))
    found = latest(notebook.read(book))
    assert found is not None
    assert found.start_s == pytest.approx(27.98)
    assert found.span_s == pytest.approx(27.98)
    assert "(100%)" in found.sentence()
