"""The notebook: envelope, tolerant reader, no torn lines under concurrency, no secrets."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from kvlab import SCHEMA, __version__
from kvlab.core.errors import InputError
from kvlab.records import notebook
from kvlab.records.models import build


def test_envelope_and_roundtrip(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    record = build("reuse", "offload-off", notebook.LAB_OFFLOAD, turns=6)
    notebook.append(book, record)
    read = notebook.read(book)
    assert len(read.records) == 1
    got = read.records[0]
    for key in ("lab", "record", "label", "recorded_at", "kvlab_version", "schema"):
        assert key in got
    assert got["schema"] == SCHEMA and got["kvlab_version"] == __version__
    assert got["turns"] == 6


def test_reader_skips_prose_and_counts_broken(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    book.write_text('# My notes\n\nSome prose.\n{"label": "a", "record": "x"}\n{"broken": \n'
                    '[1, 2]\n', encoding="utf-8")
    read = notebook.read(book)
    assert [r["label"] for r in read.records] == ["a"]
    assert read.prose_lines == 3 and read.broken_lines == 1


def test_secret_fields_are_refused_before_writing(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    bad_records = ({"api_key": "x"}, {"nested": {"HF_TOKEN": "x"}},
                   {"rows": [{"Authorization": "b"}]})
    for bad in bad_records:
        with pytest.raises(ValueError, match="secret"):
            notebook.append(book, build("x", "y", "z", **bad))
    assert not book.exists()
    notebook.append(book, build("x", "y", "z", prompt_tokens=3, cached_tokens=2))
    assert len(notebook.read(book).records) == 1


def test_non_finite_numbers_become_null(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    notebook.append(book, build("x", "y", "z", ratio=float("nan"), v=[float("inf")]))
    line = book.read_text(encoding="utf-8")
    assert json.loads(line)["ratio"] is None and "NaN" not in line


def test_unwritable_notebook_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "dir"
    target.mkdir()
    with pytest.raises(InputError, match="LABBOOK"):
        notebook.append(target, build("x", "y", "z"))


def test_missing_notebook_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        notebook.read(tmp_path / "none.md")


def _writer(args: tuple[str, int]) -> None:
    path, worker = args
    pad = "x" * (worker * 700)  # lines of different lengths, some beyond PIPE_BUF
    for i in range(1000):
        notebook.append(path, build("stress", f"w{worker}", "lab", i=i, pad=pad))


def test_eight_processes_thousand_appends_each(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        pool.map(_writer, [(str(book), w) for w in range(8)])
    read = notebook.read(book)
    assert read.broken_lines == 0 and read.prose_lines == 0
    assert len(read.records) == 8000
    for worker in range(8):
        seen = sorted(r["i"] for r in read.records if r["label"] == f"w{worker}")
        assert seen == list(range(1000))
