"""The notebook: envelope, tolerant reader, no torn lines under concurrency, no secrets."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from kvlab import SCHEMA, __version__
from kvlab.core.errors import InputError
from kvlab.records import notebook
from kvlab.records.link import LinkRecord
from kvlab.records.notes import NotRunRecord
from kvlab.records.pd import PredictionRecord
from kvlab.records.reuse import ReuseRecord


def test_envelope_and_roundtrip(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    record = ReuseRecord(label="offload-off", lab=notebook.LAB_OFFLOAD, turns=6)
    notebook.append(book, record)
    line = json.loads(book.read_text(encoding="utf-8"))
    for key in ("lab", "record", "label", "recorded_at", "kvlab_version", "schema"):
        assert key in line
    read = notebook.read(book)
    assert len(read.records) == 1
    got = read.records[0]
    assert isinstance(got, ReuseRecord)
    assert got.schema_version == SCHEMA and got.kvlab_version == __version__
    assert got.turns == 6


def test_reader_skips_prose_and_counts_broken(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    book.write_text('# My notes\n\nSome prose.\n{"label": "a", "record": "not-run", '
                    '"lab": "l", "row": "r", "reason": "w"}\n{"broken": \n[1, 2]\n',
                    encoding="utf-8")
    read = notebook.read(book)
    assert [r.label for r in read.records] == ["a"]
    assert read.prose_lines == 3 and read.broken_lines == 1
    assert read.broken == [(5, "not a JSON (Expecting value, column 11)")]  # where, and why


def test_secret_fields_are_refused_before_writing(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    bad_records = (LinkRecord(label="y", lab="z", legs={"api_key": "x"}),
                   ReuseRecord(label="y", lab="z", metric_deltas={"u": {"HF_TOKEN": 1}}),
                   ReuseRecord(label="y", lab="z", warm_up_ttft_s={"Authorization": 0.1}))
    for bad in bad_records:
        with pytest.raises(ValueError, match="secret"):
            notebook.append(book, bad)
    assert not book.exists()
    notebook.append(book, PredictionRecord(label="y", lab="z", prompt_tokens=3,
                                           bytes_per_token=2.0))
    assert len(notebook.read(book).records) == 1


def test_non_finite_numbers_become_null(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    notebook.append(book, ReuseRecord(label="y", lab="z", temperature=float("nan"),
                                      warm_up_ttft_s={"u": float("inf")}))
    line = book.read_text(encoding="utf-8")
    assert json.loads(line)["warm_up_ttft_s"]["u"] is None and "NaN" not in line
    assert "Infinity" not in line and json.loads(line)["temperature"] is None


def test_unwritable_notebook_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "dir"
    target.mkdir()
    with pytest.raises(InputError, match="LABBOOK"):
        notebook.append(target, NotRunRecord(label="y", lab="z", row="r", reason="w"))


def test_missing_notebook_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        notebook.read(tmp_path / "none.md")


def _writer(args: tuple[str, int]) -> None:
    path, worker = args
    pad = "x" * (worker * 700)  # lines of different lengths, some beyond PIPE_BUF
    for i in range(1000):
        notebook.append(path, NotRunRecord(label=f"w{worker}", lab="lab", row=str(i), reason=pad))


def test_eight_processes_thousand_appends_each(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        pool.map(_writer, [(str(book), w) for w in range(8)])
    read = notebook.read(book)
    assert read.broken_lines == 0 and read.prose_lines == 0
    assert len(read.records) == 8000
    for worker in range(8):
        seen = sorted(int(r.row) for r in read.records
                      if isinstance(r, NotRunRecord) and r.label == f"w{worker}")
        assert seen == list(range(1000))
