"""`kvlab plan` end to end on a small trace: its JSON, its --out line, its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.loadgen.trace import synthetic, write
from kvlab.records import PlanRecord

PROFILE = {"block_tokens": 128, "device_blocks": 40, "prefill_s_per_token": 0.0002,
           "decode_step_s": 0.02, "decode_step_per_seq_s": 0.002, "max_seqs": 16}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", "plan", *args], capture_output=True,
                          text=True, check=False)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    trace = write(tmp_path / "trace.jsonl", synthetic(60, groups=3, shared_blocks=2, rate=4.0,
                                                      output_length=8, block_tokens=128))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    return trace, profile


def test_a_plan_prints_one_json_document_and_writes_its_line(files: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    trace, profile = files
    out = tmp_path / "plan.json"
    result = run("--trace", str(trace), "--trace-block-size", "128", "--profile", str(profile),
                 "--replicas", "1,2", "--policy", "round-robin,prefix-affinity",
                 "--target-ttft-p90", "0.5", "--rate", "4", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    shown = PlanRecord.model_validate(json.loads(result.stdout))
    written = PlanRecord.model_validate(json.loads(out.read_text()))
    assert shown.points == written.points
    assert [(p.policy, p.replicas) for p in shown.points] == [
        ("round-robin", 1), ("round-robin", 2), ("prefix-affinity", 1), ("prefix-affinity", 2)]
    assert all(sum(p.requests_per_replica) == 60 for p in shown.points)
    assert len(shown.highest_rates) == 4 and len(shown.fewest_replicas) == 2
    assert shown.left_out and shown.profile.sources["device_blocks"] == "given"


def test_the_table_names_what_the_model_leaves_out(files: tuple[Path, Path]) -> None:
    trace, profile = files
    result = run("--trace", str(trace), "--trace-block-size", "128", "--profile",
                 str(profile), "--replicas", "2", "--policy", "vllm-router:cache_aware")
    assert result.returncode == 0, result.stderr
    assert "What the model leaves out" in result.stdout


def test_a_repeated_trace_plans_every_copy(files: tuple[Path, Path]) -> None:
    trace, profile = files
    result = run("--trace", str(trace), "--trace-block-size", "128", "--profile",
                 str(profile), "--replicas", "2", "--policy", "round-robin",
                 "--trace-repeat", "3", "--json")
    assert result.returncode == 0, result.stderr
    shown = PlanRecord.model_validate(json.loads(result.stdout))
    assert [sum(p.requests_per_replica) for p in shown.points] == [180]
    assert "3 copies sharing no block" in shown.workload


@pytest.mark.parametrize(("args", "named"), [
    (("--replicas", "2"), "--profile"),
    (("--policy", "random"), "--policy"),
    (("--replicas", "0,2"), "--replicas"),
    (("--sessions", "2"), "one workload"),
    (("--trace-repeat", "0"), "--trace-repeat"),
])
def test_a_wrong_option_is_one_line(files: tuple[Path, Path], args: tuple[str, ...],
                                    named: str) -> None:
    trace, profile = files
    given = ["--trace", str(trace), "--trace-block-size", "128"]
    if named != "--profile":
        given += ["--profile", str(profile)]
    result = run(*given, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and named in result.stderr
    assert "Traceback" not in result.stderr
