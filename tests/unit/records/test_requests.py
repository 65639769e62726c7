"""Per-request files: their names, their place beside the notebook, their digest."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kvlab.core.errors import InputError
from kvlab.records import requests
from kvlab.records.requests import RequestLine


def lines(n: int, warmup: int = 0) -> list[RequestLine]:
    return [RequestLine(id=i, level=2, warmup=i < warmup, status="ok", ttft_s=0.1 * (i + 1))
            for i in range(n)]


def test_names_carry_label_concurrency_repeat_and_a_suffix() -> None:
    assert requests.file_name("disagg", 8, None, "ab12cd34") == "disagg-c8-ab12cd34.jsonl"
    assert requests.file_name("offload-on-load", 4, 2, "x") == "offload-on-load-c4-r2-x.jsonl"
    # a label is free text: nothing in it can leave the folder or hide the file
    assert requests.file_name("../a b/c", 1, 0, "s") == "a_b_c-c1-r0-s.jsonl"
    assert requests.file_name("..", 1, None, "s") == "load-c1-s.jsonl"
    first, second = (requests.file_name("l", 1) for _ in range(2))
    assert first != second and first.startswith("l-c1-") and first.endswith(".jsonl")


def test_written_beside_the_notebook_private_and_read_back(tmp_path: Path) -> None:
    book = tmp_path / "lab" / "labbook.md"
    book.parent.mkdir()
    relative, digest = requests.write_beside(book, "sp", 4, 1, lines(5, warmup=2))
    assert relative.startswith(f"{requests.REQUESTS_DIR}/sp-c4-r1-")
    path = requests.location(book, relative)
    assert path.parent == tmp_path / "lab" / requests.REQUESTS_DIR
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    back = requests.read(path, digest)
    assert back == lines(5, warmup=2) and [x.warmup for x in back][:3] == [True, True, False]
    again, _ = requests.write_beside(book, "sp", 4, 1, lines(1))
    assert again != relative and requests.read(path, digest) == back  # never overwritten


def test_changed_file_and_escaping_path_are_refused(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    relative, digest = requests.write_beside(book, "x", 1, None, lines(3))
    path = requests.location(book, relative)
    path.write_text(path.read_text().replace("0.1", "0.01"))
    with pytest.raises(InputError, match="sha256 differs"):
        requests.read(path, digest)
    with pytest.raises(InputError, match="outside the notebook's folder"):
        requests.location(book, "../elsewhere.jsonl")
    with pytest.raises(InputError, match="missing"):
        requests.read(tmp_path / "kvlab-requests" / "gone.jsonl", None)
