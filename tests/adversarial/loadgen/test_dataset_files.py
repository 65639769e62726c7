"""Hostile dataset files (`kvlab load --dataset`): whatever the bytes, reading them gives the
usable records or one InputError line naming the file, never another exception.

- arbitrary bytes, arbitrary JSON values as records, records whose fields have the wrong
  types, in a JSON list or as JSON lines (hypothesis);
- a huge line (a prompt of millions of characters: read when under the limit, refused by
  its size over it), JSON nested past the parser's recursion limit, digits past Python's
  integer conversion limit, non-UTF-8 bytes, an empty file, a file of blank lines;
- every record kvlab keeps holds what the request needs (a non-blank user message, an output
  length of at least 1 or none).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.core.errors import InputError
from kvlab.loadgen import dataset
from kvlab.loadgen.dataset import DatasetSpec

PROPS = settings(max_examples=200, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow,
                                        HealthCheck.function_scoped_fixture])
SCALARS = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=8)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
SPEAKER = st.sampled_from(["human", "gpt", "system", "user", "bing", "robot", ""]) | JSON
MESSAGE = st.fixed_dictionaries({"from": SPEAKER, "value": st.text(max_size=12) | JSON})
SHAREGPT = st.fixed_dictionaries({"conversations": st.lists(MESSAGE, max_size=5) | JSON})
PROMPT = st.dictionaries(
    st.sampled_from([*dataset.PROMPT_KEYS[:3], *dataset.OUTPUT_KEYS[:3], "system", "id"]),
    st.text(max_size=12) | JSON, max_size=4)
RECORD = SHAREGPT | PROMPT | JSON


def read_or_refuse(path: Path) -> dataset.Dataset | None:
    """The dataset, or None when refused in one line that names the file."""
    try:
        data = dataset.read(DatasetSpec(str(path)))
    except InputError as exc:
        assert path.name in str(exc) and "\n" not in str(exc), str(exc)
        return None
    for entry in data.entries:
        assert entry.turns and all(t.text.strip() for t in entry.turns)
        assert all(t.output_tokens is None or t.output_tokens >= 1 for t in entry.turns)
    assert len(data.entries) + sum(data.skipped.values()) == data.records
    return data


@PROPS
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "any.jsonl"
    path.write_bytes(raw)
    read_or_refuse(path)


@PROPS
@given(records=st.lists(RECORD, max_size=6), lines=st.booleans())
def test_arbitrary_records_in_a_list_or_lines(tmp_path: Path, records: list[object],
                                              lines: bool) -> None:
    path = tmp_path / "records.json"
    path.write_text("\n".join(json.dumps(r) for r in records) if lines
                    else json.dumps(records), encoding="utf-8")
    read_or_refuse(path)


@PROPS
@given(records=st.lists(SHAREGPT, min_size=1, max_size=6))
def test_sharegpt_conversations_of_any_shape(tmp_path: Path, records: list[object]) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    data = read_or_refuse(path)
    if data is not None:
        assert data.format == "sharegpt"


def test_a_huge_line_is_read_under_the_limit_and_refused_over_it(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    big = "word " * 600_000  # three million characters
    path.write_text(json.dumps({"prompt": big}) + "\n", encoding="utf-8")
    assert dataset.read(DatasetSpec(str(path))).entries[0].turns[0].text == big
    path.write_text(json.dumps({"prompt": big + big}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"huge\.jsonl:1: prompt has 6,000,000 characters"):
        dataset.read(DatasetSpec(str(path)))


@pytest.mark.parametrize(("raw", "message"), [
    (b"", "the file holds no records"),
    (b"\n\n   \n", "the file holds no records"),
    (b"[]", "the file holds no records"),
    (b"\xff\xfe{\x00}", "not UTF-8 text"),
    (b'{"prompt": "ok"}\n{"prompt": "\xc3"}\n', "not UTF-8 text"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"prompt": "p", "output_tokens": ' + b"9" * 5000 + b"}", "not JSON"),
    (b'{"prompt": "p", "output_tokens": 1e400}', "output_tokens must be a whole number"),
    (b'"just a string"', "a record is a JSON object, not a string"),
    (b"{} {}", "not JSON"),
    (b'{"a\\nb": 1}', r'no prompt \(keys: "a\\nb"\)'),  # a key with a newline, still one line
])
def test_hostile_files_are_one_line(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "hostile.json"
    path.write_bytes(raw)
    with pytest.raises(InputError, match=message) as caught:
        dataset.read(DatasetSpec(str(path)))
    assert "hostile.json" in str(caught.value) and "\n" not in str(caught.value)


def test_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "p"}\n')
    assert dataset.read(DatasetSpec(str(path))).entries[0].turns[0].text == "p"
