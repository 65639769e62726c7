"""Typed records: writers build them, readers parse seed and kvlab lines, schemas publish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from kvlab import SCHEMA
from kvlab.records import notebook
from kvlab.records.load import RunContext
from kvlab.records.models import (
    LAB_PD,
    LoadRecord,
    NotRunRecord,
    ReuseRecord,
    StartupRecord,
    Unreadable,
    json_schemas,
    parse,
)
from kvlab.records.upgrade import SEED_VERSION, upgraded

SEED_LOAD_ROW = {  # Part 9's load-test.py writes no `record` field
    "label": "baseline", "concurrency": 4, "requests": 8, "model": "m",
    "prompt_set": "shared-prefix", "max_tokens": 16, "ttft_s": {"p50": 0.2, "p99": 0.3},
    "tpot_s": {"p50": 0.01}, "output_tokens_per_s": 90.0, "its_own_key": [1, 2],
}
VALIDATION = Path(__file__).resolve().parents[3] / "docs" / "validation"


def test_a_seed_load_row_parses_as_a_load_record_without_its_own_keys() -> None:
    typed = parse(SEED_LOAD_ROW)
    assert isinstance(typed, LoadRecord)
    assert typed.concurrency == 4 and typed.ttft_s is not None and typed.ttft_s.p50 == 0.2
    assert typed.kvlab_version == SEED_VERSION and "its_own_key" not in typed.line()


def test_a_line_round_trips_typed(tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    notebook.append(book, NotRunRecord(label="x", lab=LAB_PD, row="r", reason="why"))
    line = notebook.read(book).records[0]
    assert isinstance(line, NotRunRecord) and line.schema_version == SCHEMA
    again = parse(line.line())
    assert isinstance(again, NotRunRecord) and again.reason == "why"


def test_a_kind_kvlab_does_not_know_is_foreign() -> None:
    got = parse({"record": "from-the-future", "label": "l", "lab": "x", "v": 3})
    assert isinstance(got, Unreadable) and got.foreign and "from-the-future" in got.why


def test_a_malformed_known_kind_is_unreadable_and_says_which_field() -> None:
    got = parse({"record": "load", "label": "l", "lab": "x", "schema": SCHEMA,
                 "concurrency": "many", "requests": 1})
    assert isinstance(got, Unreadable) and not got.foreign and "concurrency" in got.why


def test_an_undeclared_key_is_refused_by_name() -> None:
    got = parse({"record": "not-run", "label": "l", "lab": "x", "schema": SCHEMA, "row": "r",
                 "reason": "why", "extra_evidence": {"a": 1}})
    assert isinstance(got, Unreadable) and "extra_evidence" in got.why
    with pytest.raises(ValidationError, match="extra_evidence"):
        NotRunRecord.model_validate({"label": "l", "lab": "x", "row": "r", "reason": "why",
                                     "extra_evidence": 1})


def test_the_notebook_counts_and_explains_an_unreadable_line(tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    book.write_text(json.dumps({"record": "load", "label": "l", "lab": "x", "schema": SCHEMA,
                                "concurrency": 1, "requests": 1, "ttft_s": {"p50": "slow"}})
                    + "\n", encoding="utf-8")
    read = notebook.read(book)
    assert read.records == [] and read.broken_lines == 1
    assert "ttft_s.p50" in read.unreadable[0]


def test_a_schema_1_line_is_upgraded_before_it_is_validated() -> None:
    old = {"record": "load", "label": "l", "lab": "x", "schema": 1, "concurrency": 1,
           "requests": 1, "mem_fraction": 0.85}
    typed = parse(old)
    assert isinstance(typed, LoadRecord) and typed.memory_fraction == 0.85
    assert typed.schema_version == 1  # what was written stays said


def test_a_schema_2_reuse_row_gets_its_first_answer_token() -> None:
    old = {"record": "reuse", "label": "l", "lab": "x", "schema": 2, "rows": [
        {"turn": 1, "endpoint": "u", "ttft_s": 0.25},
        {"turn": 2, "endpoint": "u", "ttft_s": 0.5, "ttft_from": "first chunk (no content)"}]}
    typed = parse(old)
    assert isinstance(typed, ReuseRecord)
    content, fallback = typed.rows
    assert (content.ttft_s, content.ttft_answer_s) == (0.25, 0.25)
    assert (fallback.ttft_s, fallback.ttft_answer_s) == (0.5, None)  # it had no answer token


def test_every_committed_notebook_line_is_declared_field_by_field() -> None:
    books = sorted(VALIDATION.rglob("*notebook*.jsonl"))
    assert books, f"no committed notebooks under {VALIDATION}"
    for book in books:
        read = notebook.read(book)
        assert read.unreadable == [] and read.broken_lines == 0 and read.foreign_lines == 0, book
        lines = [json.loads(t) for t in book.read_text(encoding="utf-8").splitlines()
                 if t.startswith("{")]
        assert len(lines) == len(read.records)
        for raw, typed in zip(lines, read.records, strict=True):
            _within(upgraded(raw, frozenset())[0], typed.line(), f"{book}: {raw['record']}")


def _within(raw: object, typed: object, where: str) -> None:
    """Every value the line held is in its typed reading, unchanged (a typed line leaves
    nulls out and may add its defaults)."""
    if isinstance(raw, dict):
        assert isinstance(typed, dict), where
        for key, value in raw.items():
            if value is not None:
                assert key in typed, f"{where}.{key}"
                _within(value, typed[key], f"{where}.{key}")
    elif isinstance(raw, list):
        assert isinstance(typed, list) and len(raw) == len(typed), where
        for i, (a, b) in enumerate(zip(raw, typed, strict=True)):
            _within(a, b, f"{where}[{i}]")
    else:
        assert raw == typed and type(raw) is type(typed), f"{where}: {raw!r} != {typed!r}"


def test_a_record_is_built_from_its_declared_fields_only() -> None:
    with pytest.raises(ValidationError, match="concurrency"):
        LoadRecord.model_validate({"label": "l", "lab": LAB_PD, "requests": 1})


def test_a_part_is_taken_only_by_a_model_built_on_it() -> None:
    row = LoadRecord(label="l", lab=LAB_PD, concurrency=1, requests=1)
    row.overlay(RunContext(tier="none"))
    assert row.tier == "none"
    with pytest.raises(TypeError, match="not a part"):
        NotRunRecord(label="l", lab=LAB_PD, row="r", reason="why").overlay(RunContext())


def test_notebook_refuses_an_untyped_line(tmp_path: Path) -> None:
    with pytest.raises(AttributeError):
        notebook.append(tmp_path / "b.md", {"record": "x", "label": "y", "lab": "z"})  # type: ignore[arg-type]
    assert not (tmp_path / "b.md").exists()


def test_every_kind_has_a_schema_with_the_seed_names() -> None:
    schemas = json_schemas()
    assert set(schemas) >= {"startup", "reuse", "proof", "load", "link", "comparison",
                            "prediction", "crossing", "not-run", "disk"}
    assert "schema" in schemas["load"]["properties"]  # the seed's name, not the attribute's
    assert {"concurrency", "ttft_s", "tpot_s"} <= set(schemas["load"]["properties"])


def test_kvlab_schema_prints_one_document() -> None:
    done = subprocess.run([sys.executable, "-m", "kvlab", "schema", "link"],
                          capture_output=True, text=True, check=True)
    assert list(json.loads(done.stdout)) == ["link"]


def test_startup_states_its_context_and_memory_fraction() -> None:
    from kvlab.engines.registry import engine_for

    vllm = engine_for("vllm").launch_settings(
        ["vllm", "serve", "m", "--max-model-len", "4096", "--gpu-memory-utilization=0.85"])
    assert (vllm.context_tokens, vllm.memory_fraction) == (4096, 0.85)
    llama = engine_for("llama.cpp").launch_settings(["llama-server", "-c", "8192"])
    assert (llama.context_tokens, llama.memory_fraction) == (8192, None)
    broken = engine_for("vllm").launch_settings(["vllm", "--max-model-len"])
    assert broken.context_tokens is None


def test_the_report_reads_recorded_sizing_before_argv(tmp_path: Path) -> None:
    from kvlab.report.common import measured_on

    book = tmp_path / "book.md"
    start = StartupRecord(label="x", lab=LAB_PD, engine="vllm", role="baseline", run_id="r",
                          engine_version="1", argv=["vllm", "--max-model-len", "4096"],
                          context_tokens=2048, memory_fraction=0.5)
    notebook.append(book, start)
    row = LoadRecord(label="x", lab=LAB_PD, concurrency=1, requests=1, run_id="r")
    notebook.append(book, row)
    said = measured_on(notebook.read(book), row)
    assert "ctx 2048" in said and "mem fraction 0.5" in said
