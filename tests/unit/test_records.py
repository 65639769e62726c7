"""Typed records: writers build them, readers parse seed and kvlab lines, schemas publish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.records import notebook
from kvlab.records.models import (
    LAB_PD,
    LoadRecord,
    NotRunRecord,
    Record,
    build,
    json_schemas,
    parse,
)

SEED_LOAD_ROW = {  # Part 9's load-test.py writes no `record` field
    "label": "baseline", "concurrency": 4, "requests": 8, "model": "m",
    "prompt_set": "shared-prefix", "max_tokens": 16, "ttft_s": {"p50": 0.2, "p99": 0.3},
    "tpot_s": {"p50": 0.01}, "output_tokens_per_s": 90.0,
}


def test_a_seed_load_row_parses_as_a_load_record() -> None:
    typed = parse(SEED_LOAD_ROW)
    assert isinstance(typed, LoadRecord)
    assert typed.concurrency == 4 and typed.ttft_s is not None and typed.ttft_s.p50 == 0.2


def test_a_line_round_trips_with_its_extra_fields(tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    notebook.append(book, NotRunRecord(label="x", lab=LAB_PD, row="r", reason="why",
                                       extra_evidence={"a": 1}))
    line = notebook.read(book).records[0]
    assert isinstance(line, NotRunRecord)
    assert line["schema"] == 1 and line["extra_evidence"] == {"a": 1}
    again = parse(line.line())
    assert isinstance(again, NotRunRecord) and again.reason == "why"


def test_a_kind_kvlab_does_not_know_keeps_its_envelope() -> None:
    typed = parse({"record": "from-the-future", "label": "l", "lab": "x", "v": 3})
    assert type(typed) is Record and typed.get("v") == 3


def test_a_malformed_known_kind_falls_back_rather_than_failing() -> None:
    typed = parse({"record": "load", "label": "l", "lab": "x", "concurrency": "many"})
    assert type(typed) is Record


def test_build_validates_the_kind() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        build("load", "l", LAB_PD, requests=1)


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
    from kvlab.engines.base import engine_for

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
    start = build("startup", "x", LAB_PD, engine="vllm", role="baseline", run_id="r",
                  engine_version="1", argv=["vllm", "--max-model-len", "4096"],
                  context_tokens=2048, memory_fraction=0.5)
    notebook.append(book, start)
    row = build("load", "x", LAB_PD, concurrency=1, requests=1, run_id="r")
    notebook.append(book, row)
    said = measured_on(notebook.read(book), row)
    assert "ctx 2048" in said and "mem fraction 0.5" in said
