"""`kvlab compare`: the seed's output and record, plus kvlab's checks and byte verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import seeds
from kvlab.core.errors import InputError, RefusedError
from kvlab.measure import compare, intervals, link_bytes, pairing
from kvlab.records import notebook
from kvlab.records.comparison import BytesEvidence, NixlTransfer, RatioInterval
from kvlab.records.evidence import KvCapacity, Percentiles
from kvlab.records.link import NixlCounters, RdmaCounters
from kvlab.records.models import ComparisonRecord, LinkRecord, LoadRecord, Record, StartupRecord
from kvlab.records.pressure import Pressure
from perrequest import lognormal, plan, run_row

DATA = Path(__file__).resolve().parents[2] / "data"


def row(label: str, level: int, ttft: float, tpot: float, thru: float,
        **extra: Any) -> LoadRecord:
    fields: dict[str, Any] = {
        "concurrency": level, "requests": 8, "ok": 8, "failed": 0, "model": "m",
        "prompt_set": "shared-prefix", "max_tokens": 16, "prompt_tokens_mean": 1000.0,
        "ttft_s": Percentiles(p50=ttft, p90=ttft, p99=ttft, mean=ttft),
        "tpot_s": Percentiles(p50=tpot, p90=tpot, p99=tpot, mean=tpot),
        "output_tokens_per_s": thru, **extra}
    return LoadRecord(label=label, lab=notebook.LAB_PD, **fields)


def link(label: str, rx: int | None, **extra: Any) -> LinkRecord:
    return LinkRecord(label=label, lab=notebook.LAB_PD, base_url="u", connector="nixl",
                      context_length=8192, prompt_set="shared-prefix", concurrency="1,4",
                      requests=8, iface="lo", wall_s=3, rx_bytes=rx,
                      tx_bytes=None if rx is None else rx // 2, **extra)


def book(tmp_path: Path, *records: Record) -> Path:
    path = tmp_path / "labbook.md"
    path.write_text("# notes in prose are skipped\n")
    for r in records:
        notebook.append(path, r)
    return path


def pair() -> list[Record]:
    """A baseline and a split at c=1 and 4, no per-request files."""
    return [row("baseline", 1, 0.2, 0.01, 90), row("baseline", 4, 0.4, 0.012, 300),
            row("disagg", 1, 0.3, 0.009, 95), row("disagg", 4, 0.5, 0.011, 310)]


def test_same_table_as_the_seed(tmp_path: Path) -> None:
    path = book(tmp_path, *pair(), link("disagg", 16_000_000))
    script = seeds.extract("compare-disagg.py", tmp_path)
    seed = subprocess.run([sys.executable, str(script), "--labbook", str(path), "--print-only"],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    ours = compare.compare_runs(notebook.read(path).records, str(path), "disagg", "baseline")
    assert ours.lines[:4] == seed[:4]  # header, column heads, one line per level
    assert "1.50x" in ours.lines[2] and "+50.0%" in ours.lines[2]


def test_record_keeps_the_seed_fields(tmp_path: Path) -> None:
    path = book(tmp_path, *pair(), link("disagg", 16_000_000))
    result = compare.compare_runs(notebook.read(path).records, str(path), "disagg", "baseline",
                             kv_bytes_per_token=2000, prompt_tokens=1000, note="n")
    rec = result.record.line()
    for key in ("lab", "record", "disagg_label", "baseline_label", "model", "prompt_set",
                "connector", "iface", "kv_bytes_per_token", "prompt_tokens",
                "predicted_bytes_per_request", "observed_bytes_per_request", "levels",
                "same_experiment", "note", "recorded_at"):
        assert key in rec
    assert rec["record"] == "comparison" and rec["same_experiment"] is True
    assert rec["predicted_bytes_per_request"] == 2_000_000
    # the seed's formula: the larger counter over the requests of the shared levels
    assert rec["observed_bytes_per_request"] == 16_000_000 / 16
    assert rec["levels"][0]["ttft_p50_disagg_s"] == 0.3
    assert rec["bytes"]["verdict"] == link_bytes.CROSSED


def seen_bytes(record: ComparisonRecord) -> BytesEvidence:
    assert record.bytes is not None
    return record.bytes


def test_verdicts_three_ways(tmp_path: Path) -> None:
    nixl = {"http://d/metrics": NixlCounters(nixl_bytes=0.0, nixl_transfers=0.0)}
    records = [*pair(), link("disagg", 16_000_000, nixl=nixl,
                             rdma=RdmaCounters(rx_bytes=64, tx_bytes=0))]
    seen = seen_bytes(compare.compare_runs(records, "b", "disagg", "baseline",
                                      kv_bytes_per_token=2000).record)
    by = seen.observed_bytes_per_request_by_source
    assert by == {"iface": 1_000_000.0, "rdma": 4.0, "nixl": 0.0}
    # NIXL's own count wins over interface noise: nothing crossed
    assert seen.verdict == link_bytes.NOT_CROSSED
    assert seen.verdict_source == "nixl"
    assert seen.prompt_tokens_from == "server usage"
    small = compare.compare_runs([*pair(), link("disagg", 1_000)], "b", "disagg", "baseline",
                            kv_bytes_per_token=2000).record
    assert seen_bytes(small).verdict == link_bytes.NOT_CROSSED
    mid = compare.compare_runs([*pair(), link("disagg", 1_000_000)], "b", "disagg", "baseline",
                          kv_bytes_per_token=2000).record
    assert seen_bytes(mid).verdict == link_bytes.UNCLEAR
    none = compare.compare_runs([*pair(), link("disagg", None)], "b", "disagg", "baseline")
    assert seen_bytes(none.record).verdict is None
    assert any("recorded no byte counters" in line for line in none.lines)


def test_not_the_same_experiment(tmp_path: Path) -> None:
    records = [row("baseline", 1, 0.2, 0.01, 90, context_length=4096),
               row("baseline", 8, 0.2, 0.01, 90),
               row("disagg", 1, 0.3, 0.01, 95, max_tokens=32, context_length=8192)]
    result = compare.compare_runs(records, "b", "disagg", "baseline")
    assert result.record.same_experiment is False
    text = "\n".join(result.lines)
    assert "not the same experiment" in text
    assert "concurrency 1: max_tokens differs (32 against 16)" in text
    assert "concurrency levels differ ([1] against [1, 8])" in text
    assert "context_length differs (8192 against 4096)" in text


def test_quantised_kv_is_never_paired_with_f16() -> None:
    records = [*pair()]
    records[0] = records[0].model_copy(update={"kv_cache_type": "f16"})
    records[2] = records[2].model_copy(update={"kv_cache_type": "q8_0"})
    with pytest.raises(RefusedError, match="q8_0"):
        compare.compare_runs(records, "b", "disagg", "baseline")
    # both quantised but different: a warning, not a refusal
    records[0] = records[0].model_copy(update={"kv_cache_type": "q4_0"})
    result = compare.compare_runs(records, "b", "disagg", "baseline")
    assert "kv_cache_type differs" in "\n".join(result.warnings)


def test_missing_labels_and_no_shared_level() -> None:
    with pytest.raises(InputError, match="Labels present: baseline"):
        compare.compare_runs(pair()[:2], "b", "disagg", "baseline")
    with pytest.raises(InputError, match="share no concurrency level"):
        compare.compare_runs([row("baseline", 1, 1, 1, 1), row("disagg", 2, 1, 1, 1)], "b",
                        "disagg", "baseline")


def test_offload_pairing_states_pressure() -> None:
    startup_on = StartupRecord(label="offload-on", lab=notebook.LAB_OFFLOAD, engine="vllm",
                               role="offload",
                               capacity=KvCapacity(kv_cache_tokens=3000, max_concurrency=0.7))
    on = row("offload-on-load", 4, 0.1, 0.01, 100,
             metric_deltas={"preemptions": 3.0, "kv_cache_usage_perc_end": 0.97})
    off = row("offload-off-load", 4, 0.3, 0.01, 80, metric_deltas={"preemptions": 0.0})
    result = compare.compare_runs([startup_on, on, off], "b", pairing.OFFLOAD_ON,
                                  pairing.OFFLOAD_OFF, offload=True, lab=notebook.LAB_OFFLOAD)
    pressure = result.record.pressure
    assert pressure is not None
    assert pressure["offload-on-load"].under_pressure is True
    assert pressure["offload-on-load"].kv_cache_tokens == 3000
    assert pressure["offload-on-load"].levels["4"].preemptions == 3.0
    # no cache size, peak usage or reusable share for the tier-off run: unknown, never "quiet"
    assert pressure["offload-off-load"].under_pressure is None
    text = "\n".join(result.lines)
    assert "a cache of 3,000 tokens (from the startup line); c=4: 3 preemptions" in text
    assert "offload-off-load: a cache of unknown size" in text and "pressure unknown" in text


def test_compare_takes_the_newest_tier_run_whatever_its_size() -> None:
    """`kvlab compare --offload` compares the run just made, as the seed's compare-disagg.py
    does: a `--tier-gb` run below the working set too. Only the report keeps such a run apart
    from the pair whose tier held the working set."""
    def side(label: str, ttft: float, run: str, tier_gib: float) -> Record:
        planned = plan(host_tier_bytes=int(tier_gib * 2**30), bytes_per_token=147_456.0,
                       working_set_tokens=131_472)
        return row(label, 18, ttft, 0.02, 70, run_id=run,
                   pressure=Pressure(state="under pressure", planned=planned))
    records = [side("offload-off-load", 0.30, "holds", 0),
               side("offload-on-load", 0.12, "holds", 32),
               side("offload-off-load", 0.20, "small", 0),
               side("offload-on-load", 0.21, "small", 6)]
    result = compare.compare_runs(records, "b", pairing.OFFLOAD_ON, pairing.OFFLOAD_OFF,
                                  offload=True)
    assert "1.05x" in result.lines[2], result.lines
    on, off = pairing.paired_rows(records, pairing.OFFLOAD_ON, pairing.OFFLOAD_OFF)
    assert (on[18].ttft_s.p50, off[18].ttft_s.p50) == (0.12, 0.30)  # type: ignore[union-attr]


def test_cli_compare_model_config_and_append(tmp_path: Path) -> None:
    path = book(tmp_path, *pair(), link("disagg", 16_000_000))
    run = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--labbook", str(path),
                          "--model-config", str(DATA / "qwen3-8b-config.json"),
                          "--prompt-tokens", "8192", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["written"] and out["comparison"]["predicted_bytes_per_request"] == 147456 * 8192
    assert notebook.read(path).of(ComparisonRecord)[0].prompt_tokens == 8192
    # the seed still reads a notebook that holds kvlab's comparison line
    script = seeds.extract("compare-disagg.py", tmp_path)
    seed = subprocess.run([sys.executable, str(script), "--labbook", str(path), "--print-only"],
                          capture_output=True, text=True)
    assert seed.returncode == 0, seed.stderr
    empty = tmp_path / "empty.md"
    empty.write_text("prose only\n")
    run = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--labbook", str(empty)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "No JSON lines found" in run.stderr


def level_of(**fields: Any) -> LoadRecord:
    return LoadRecord(label="disagg", lab=notebook.LAB_PD, concurrency=1,
                      prompt_tokens_mean=1000.0, **fields)


def link_of(**fields: Any) -> LinkRecord:
    return LinkRecord(label="disagg", lab=notebook.LAB_PD, **fields)


def test_a_shared_store_on_loopback_is_judged_by_its_growth() -> None:
    rows = {1: level_of(requests=10, ok=10)}
    link = link_of(iface="lo", connector="shared", rx_bytes=5_000, tx_bytes=5_000,
                   store_bytes=20_000_000)
    seen = link_bytes.bytes_three_ways(link, rows, [1], 2048.0, None)
    assert seen.observed["store"] == 2_000_000 and seen.verdict_source == "store"
    assert seen.verdict == link_bytes.CROSSED
    # written once, read by every request: what decode loaded is the transfer
    read = link.model_copy(update={"store_bytes": 2_000_000, "metric_deltas": {
        "prefill": {"prompt_tokens_external_kv_transfer": 0.0},
        "decode": {"prompt_tokens_external_kv_transfer": 8_960.0}}})
    seen = link_bytes.bytes_three_ways(read, rows, [1], 2048.0, None)
    assert seen.observed["store_read"] == 8_960 * 2048 / 10
    assert seen.verdict_source == "store_read" and seen.verdict == link_bytes.CROSSED
    lines = compare._link_lines("disagg", link, seen)
    assert any("shared store growth" in line for line in lines)
    no_store = link.model_copy(update={"store_bytes": None})
    blind = link_bytes.bytes_three_ways(no_store, rows, [1], 2048.0, None)
    assert blind.verdict is None  # loopback counters are not evidence for a file store


def test_decode_that_did_not_prefill_is_the_verdict_for_a_shared_store() -> None:
    rows = {1: level_of(requests=16, ok=16)}
    link = link_of(iface="lo", connector="shared", rx_bytes=1, tx_bytes=1,
                   store_bytes=114_710, legs={"prefill": "P", "decode": "D"},
                   metric_deltas={"P": {"prompt_tokens": 16_000.0},
                                  "D": {"prompt_tokens": 16_000.0,
                                        "prompt_tokens_local_compute": 1_648.0,
                                        "prompt_tokens_external_kv_transfer": 896.0}})
    seen = link_bytes.bytes_three_ways(link, rows, [1], 2048.0, None)
    assert seen.decode_computed_share == 0.103
    assert seen.verdict is not None and seen.verdict.startswith("the cache crossed the store")
    recomputing = link.model_copy(update={"metric_deltas": {
        "D": {"prompt_tokens": 16_000.0, "prompt_tokens_local_compute": 15_900.0}}})
    assert link_bytes.bytes_three_ways(recomputing, rows, [1], 2048.0, None).verdict == (
        link_bytes.NOT_CROSSED)


def test_a_row_without_tpot_is_n_a_not_a_crash_or_zero(tmp_path: Path) -> None:
    # MAX_TOKENS=1 on the disaggregated run: its rows carry no tpot_s at all
    one_token = [row("disagg", level, 0.3, 0.0, 95, max_tokens=1, tpot_s=None)
                 for level in (1, 4)]
    assert all("tpot_s" not in r.line() for r in one_token)
    path = book(tmp_path, *pair()[:2], *one_token)
    run = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--labbook", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    level_1 = next(line for line in run.stdout.splitlines() if line.strip().startswith("1 "))
    assert level_1.split()[3:5] == ["n/a", "n/a"]  # TPOT ratio and percentage
    assert "0.00x" not in run.stdout and "-100.0%" not in run.stdout
    assert "the disagg row has no tpot_s (max_tokens 1)" in run.stdout
    level = notebook.read(path).of(ComparisonRecord)[0].levels[0]
    assert level.tpot_p50_disagg_s is None and level.tpot_p50_baseline_s == 0.01
    assert level.tpot_p50 is not None
    assert level.tpot_p50.startswith("n/a: the disagg row has no tpot_s")


def two_runs(path: Path, disagg_median: float) -> None:
    """baseline and disagg at c=1 and c=4, 60 requests a level, per-request files written."""
    for label, median, seed in (("baseline", 0.2, 0), ("disagg", disagg_median, 10)):
        for level in (1, 4):
            run_row(path, label, level, lognormal(seed + level, 60, median))


def test_each_ratio_has_its_interval_and_words(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    two_runs(path, 0.4)
    result = compare.compare_runs(notebook.read(path).records, str(path), "disagg", "baseline")
    assert result.lines[2].split()[0] == "1" and result.lines[2].split()[1].endswith("x")
    start = result.lines.index(next(line for line in result.lines
                                    if line.startswith("==> Ratios with 95% intervals")))
    rows = result.lines[start + 2: start + 8]
    assert [line.split()[:3] for line in rows] == [
        ["1", "TTFT", "p50"], ["1", "TPOT", "p50"], ["1", "output", "tok/s"],
        ["4", "TTFT", "p50"], ["4", "TPOT", "p50"], ["4", "output", "tok/s"]]
    assert rows[0].endswith("slower (60 / 60 requests)") and "[" in rows[0]
    assert rows[2].split("]")[1].startswith(" lower")
    level = result.record.levels[0]
    assert level.intervals is not None
    ttft = level.intervals["ttft_p50"]
    assert ttft.words == "slower" and ttft.low is not None and ttft.high is not None
    assert 1 < ttft.low < 2 < ttft.high
    assert ttft.requests == [60, 60] and ttft.repeats == [1, 1]
    assert level.ttft_p50_disagg_s is not None  # the seed's fields are still there
    assert result.record.interval_method == intervals.METHOD


def test_two_identical_configurations_show_no_measurable_difference(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    two_runs(path, 0.2)
    result = compare.compare_runs(notebook.read(path).records, str(path), "disagg", "baseline")
    for level in result.record.levels:
        assert level.intervals is not None
        assert level.intervals["ttft_p50"].words == intervals.NO_DIFFERENCE
    assert sum(intervals.NO_DIFFERENCE in line for line in result.lines) >= 4


def test_rows_without_per_request_files_keep_the_point_ratio(tmp_path: Path) -> None:
    path = book(tmp_path, *pair(), link("disagg", 16_000_000))
    result = compare.compare_runs(notebook.read(path).records, str(path), "disagg", "baseline")
    assert "       1  TTFT p50       1.50x (no interval: no per-request data)" in result.lines
    found = result.record.levels[0].intervals
    assert found is not None
    assert found["ttft_p50"] == RatioInterval(ratio=1.5, low=None, high=None,
                                              words=intervals.NO_DATA, requests=None,
                                              repeats=None)
    written = result.record.line()["levels"]
    assert isinstance(written, list) and isinstance(written[0], dict)
    assert written[0]["intervals"] == {  # what the line holds: no nulls
        "ttft_p50": {"ratio": 1.5, "words": intervals.NO_DATA},
        "tpot_p50": {"ratio": 0.9, "words": intervals.NO_DATA},
        "output_tokens_per_s": {"ratio": 1.0556, "words": intervals.NO_DATA}}


def test_cli_compare_refuses_a_changed_per_request_file(tmp_path: Path) -> None:
    path = tmp_path / "labbook.md"
    two_runs(path, 0.4)
    row_of = notebook.read(path).of(LoadRecord, "disagg")[0]
    changed = tmp_path / str(row_of.requests_file)
    changed.write_text(changed.read_text() + changed.read_text().splitlines()[0] + "\n")
    run = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--labbook", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert "sha256 differs from the notebook row's requests_sha256" in run.stderr
    assert not notebook.read(path).of(ComparisonRecord)  # nothing appended


def test_prompts_of_different_sizes_are_not_the_same_experiment() -> None:
    records = [row("baseline", 1, 0.2, 0.01, 90, prompt_tokens_mean=519.0),
               row("disagg", 1, 0.3, 0.01, 95, prompt_tokens_mean=1389.0)]
    result = compare.compare_runs(records, "b", "disagg", "baseline")
    assert result.record.same_experiment is False
    assert "1,389 prompt tokens a request against 519" in "\n".join(result.warnings)


def test_nixl_timing_from_its_own_histograms_beside_the_bytes(tmp_path: Path) -> None:
    """Two transfers of 466,092,032 bytes in 1.1 s each (the one-GPU machine's UCX over TCP):
    the comparison states them, the rate they imply, and no timing when none was exported."""
    nixl = {"http://d/metrics": NixlCounters(nixl_bytes=932_184_064.0, nixl_transfers=2.0,
                                             nixl_transfer_s=2.2)}
    result = compare.compare_runs([*pair(), link("disagg", 10_000, nixl=nixl)], "b", "disagg",
                             "baseline", kv_bytes_per_token=114_688)
    timing = seen_bytes(result.record).nixl_transfer
    assert timing == NixlTransfer(transfers=2.0, bytes_per_transfer=466_092_032.0,
                                  seconds_per_transfer=1.1, gbit_per_s=3.39)
    assert any(line.startswith("    NIXL's own timing: 2 transfers of") and "1.1000 s each "
               "(3.39 Gbit/s)" in line for line in result.lines)
    bare = {"http://d/metrics": NixlCounters(nixl_bytes=932_184_064.0, nixl_transfers=2.0)}
    untimed = compare.compare_runs([*pair(), link("disagg", 10_000, nixl=bare)], "b", "disagg",
                              "baseline", kv_bytes_per_token=114_688).record
    assert seen_bytes(untimed).nixl_transfer is None


def test_a_split_is_set_against_the_baseline_of_its_own_run() -> None:
    """Two splits, each run with its own baseline: the older split's comparison takes its
    own run's baseline, not the newest one (the H200 notebook holds NIXL's and Mooncake's)."""
    records = [row("baseline", 1, 0.065, 0.02, 80.0, run_id="nixl"),
               row("nixl-split", 1, 1.55, 0.02, 14.0, run_id="nixl"),
               row("mooncake-split", 1, 0.44, 0.02, 38.0, run_id="mooncake"),
               row("baseline", 1, 0.048, 0.02, 79.0, run_id="mooncake")]
    split, base = pairing.paired_rows(records, "nixl-split", "baseline")
    assert (split[1].run_id, base[1].run_id) == ("nixl", "nixl")
    split, base = pairing.paired_rows(records, "mooncake-split", "baseline")
    assert base[1].ttft_s is not None and base[1].ttft_s.p50 == 0.048
    alone = [row("baseline", 1, 0.065, 0.02, 80.0, run_id="a"),
             row("split", 1, 1.5, 0.02, 14.0, run_id="b")]  # no shared run: the newest each
    assert pairing.paired_rows(alone, "split", "baseline")[1][1].run_id == "a"


def test_a_changed_memory_fraction_is_a_stated_difference() -> None:
    # the committed H200 notebook's split ran at 0.4 against a baseline at 0.85
    records = [row("baseline", 1, 0.2, 0.01, 90, memory_fraction=0.85),
               row("disagg", 1, 0.3, 0.01, 95, memory_fraction=0.4)]
    text = "\n".join(compare.compare_runs(records, "b", "disagg", "baseline").lines)
    assert "memory_fraction differs (0.4 against 0.85)" in text


def test_the_ttft_difference_is_split_by_the_engines_accounts() -> None:
    """#46: a user's own A/B says where the TTFT went, where both rows carry the account."""
    from kvlab.records import TtftAccount

    def account(client: float, queue: float, prefill: float) -> TtftAccount:
        return TtftAccount(source="vLLM's request-time histograms", requests=8,
                           client_ttft=client, queue=queue, prefill=prefill,
                           engine_ttft=queue + prefill, outside=client - queue - prefill)

    records: list[Record] = [
        row("baseline", 1, 0.2, 0.01, 90, ttft_account=account(0.2, 0.01, 0.18)),
        row("disagg", 1, 0.3, 0.009, 95, ttft_account=account(0.3, 0.1, 0.19)),
        row("baseline", 4, 0.4, 0.012, 300), row("disagg", 4, 0.5, 0.011, 310)]
    lines = compare.compare_runs(records, "b", "disagg", "baseline").lines
    found = [line for line in lines if line.startswith("    concurrency 1: mean TTFT")]
    assert found == ["    concurrency 1: mean TTFT 0.300 s against 0.200 s (+0.100 s): "
                     "waiting to be scheduled +0.090 s, computing the prompt +0.010 s, "
                     "outside the engine +0.000 s (from vLLM's request-time histograms)"]
    assert not any(line.startswith("    concurrency 4: mean TTFT") for line in lines)
    bare = compare.compare_runs(pair(), "b", "disagg", "baseline").lines
    assert not any("by the engines' own accounts" in line for line in bare)
