"""The replicas row's answer: the fastest arms (overlapping TTFT intervals), then the most
reuse; an arm with failures never wins; the figures are the lines' own."""

from __future__ import annotations

from pathlib import Path

from kvlab.records import notebook
from kvlab.records.evidence import Percentiles
from kvlab.records.models import parse
from kvlab.records.notes import NoteRecord
from kvlab.records.plan import PlanPoint
from kvlab.records.replicas import ReplicaCounts, ReplicasRecord
from kvlab.report import replicas as answer


def arm(name: str, hit: float, p50: float, low: float, high: float, failed: int = 0,
        imbalance: float = 1.0) -> ReplicasRecord:
    return ReplicasRecord(
        lab="l", label=f"replicas-{name}", arm=name, router="kvlab proxy", policy=name,
        prompt_set="shared-prefix", seed=0, concurrency=2, requests=18, failed=failed,
        replicas=[ReplicaCounts(url=f"http://127.0.0.1:{i}", requests=6) for i in range(3)],
        hit_rate=hit, imbalance=imbalance, ttft_s=Percentiles(p50=p50, p99=2 * p50),
        ttft_p50_low_s=low, ttft_p50_high_s=high, oracle_hit_share=hit + 0.01,
        oracle_ideal_hit_share=0.8)


def test_reuse_decides_among_arms_latency_cannot_tell_apart() -> None:
    arms = [arm("round-robin", 0.3, 0.10, 0.09, 0.12),
            arm("prefix-affinity", 0.7, 0.11, 0.10, 0.13)]
    chosen = answer.best(arms)
    assert chosen is not None and chosen.arm == "prefix-affinity"
    text = answer.decision("shared-prefix", arms)
    assert "run prefix-affinity" in text and "70.0%" in text and "round-robin hit 30.0%" in text


def test_a_measurably_slower_arm_loses_whatever_it_hits() -> None:
    arms = [arm("round-robin", 0.3, 0.10, 0.09, 0.11),
            arm("prefix-affinity", 0.9, 0.30, 0.25, 0.35)]
    assert answer.best(arms).arm == "round-robin"  # type: ignore[union-attr]


def test_an_arm_with_failures_never_wins() -> None:
    arms = [arm("a", 0.9, 0.05, 0.04, 0.06, failed=1), arm("b", 0.2, 0.2, 0.1, 0.3)]
    assert answer.best(arms).arm == "b"  # type: ignore[union-attr]
    assert "no answer" in answer.decision("x", [arms[0]])


def test_a_line_round_trips_through_the_notebook_reader() -> None:
    line = arm("conversation-affinity", 0.5, 0.1, 0.09, 0.11).line()
    back = parse(line)
    assert isinstance(back, ReplicasRecord) and back.arm == "conversation-affinity"
    assert answer.cells(back)[2] == "50.0%"


def test_an_arm_that_loads_one_replica_is_not_the_answer_for_n() -> None:
    arms = [arm("consistent_hash", 0.66, 0.13, 0.10, 0.18, imbalance=3.0),
            arm("round-robin", 0.54, 0.26, 0.14, 0.52)]
    assert answer.best(arms).arm == "round-robin"  # type: ignore[union-attr]
    assert "no arm kept" in answer.decision("m", arms[:1])


def test_the_table_reads_the_notebook_and_names_the_answer(tmp_path: Path) -> None:
    book = tmp_path / "book.jsonl"
    for r in (arm("round-robin", 0.3, 0.10, 0.09, 0.12),
              arm("prefix-affinity", 0.7, 0.11, 0.10, 0.13)):
        notebook.append(str(book), r)
    table = answer.replicas_table(notebook.read(book))
    assert [line.name for line in table.lines] == ["round-robin (shared-prefix)",
                                                   "prefix-affinity (shared-prefix)"]
    assert table.lines[0].verdict == "measured"
    assert table.lines[1].verdict == "the lab's choice"  # a cell, short: the answer is below
    assert any("the lab's answer: shared-prefix: with 3 replicas run prefix-affinity" in e
               for e in table.lines[1].evidence)


def test_which_router_is_a_decision_with_each_arms_figures(tmp_path: Path) -> None:
    """The P/D lab's "which router" from the replicas lines: each prompt set's chosen arm,
    one short headline, and every arm's hit share and TTFT median as its chart."""
    from kvlab.report.decisions import decide

    book = tmp_path / "book.jsonl"
    for r in (arm("round-robin", 0.3, 0.10, 0.09, 0.12),
              arm("prefix-affinity", 0.7, 0.11, 0.10, 0.13)):
        notebook.append(str(book), r)
    found = {d.question: d for d in decide(notebook.read(book))}[answer.ROUTER_Q]
    assert found.decided and found.lab == "pd" and found.outcome == "choice"
    assert found.head == "With 3 replicas, route by prefix-affinity (kvlab proxy)"
    assert "run prefix-affinity (kvlab proxy): hit rate 70.0%" in found.answer
    assert found.rows == ("replicas-prefix-affinity",)
    hits, ttft = found.chart
    assert [(m.name, m.value, m.chosen) for m in hits.marks] == [
        ("round-robin", 0.3, False), ("prefix-affinity", 0.7, True)]
    assert [(m.value, m.low, m.high) for m in ttft.marks] == [(0.10, 0.09, 0.12),
                                                              (0.11, 0.10, 0.13)]


def test_which_router_undecided_without_a_replicas_line(tmp_path: Path) -> None:
    from kvlab.report.decisions import decide

    book = tmp_path / "book.jsonl"
    notebook.append(str(book), NoteRecord(lab="l", label="x", about="store", text="t"))
    found = {d.question: d for d in decide(notebook.read(book))}[answer.ROUTER_Q]
    assert not found.decided and not found.chart
    assert found.head == "Not enough evidence: the replicas lab is not in the notebook"


def test_no_line_is_said_once(tmp_path: Path) -> None:
    book = tmp_path / "book.jsonl"
    notebook.append(str(book), NoteRecord(lab="l", label="x", about="store", text="t"))
    (line,) = answer.replicas_table(notebook.read(book)).lines
    assert line.absent and "kvlab run replicas" in line.command


def test_the_plans_prediction_sits_beside_what_the_arm_measured(tmp_path: Path) -> None:
    measured = arm("prefix-affinity", 0.70, 0.100, 0.09, 0.12)
    measured.ttft_s = Percentiles(p50=0.100, p90=0.200, p99=0.3)
    measured.predicted = PlanPoint(
        policy="prefix-affinity", replicas=3, tier_blocks=0, rate=0.0, requests=18,
        prompt_tokens=5400, hit_share=0.68, tier_share=0.0,
        hit_share_per_replica=[0.7, 0.6, 0.7], requests_per_replica=[6, 7, 5],
        busiest_over_mean=1.17, ttft_s=Percentiles(p50=0.090, p90=0.250), tpot_s=None)
    book = tmp_path / "book.jsonl"
    notebook.append(str(book), measured)
    (line,) = answer.replicas_table(notebook.read(book)).lines
    assert line.cells[-1] == "hit 68.0%, TTFT p50 90 ms, 6, 7, 5"
    (said,) = [e for e in line.evidence if e.startswith("the plan, before the arm ran: ")]
    assert "hit share 68.0% predicted, 70.0% measured (-2.0 points)" in said
    assert "TTFT p50 90 ms predicted, 100 ms measured (-10%)" in said
    assert "TTFT p90 250 ms predicted, 200 ms measured (+25%)" in said
    assert "requests per replica [6, 7, 5] predicted, [6, 6, 6] measured" in said
    other = arm("round-robin", 0.3, 0.1, 0.09, 0.12)
    other.predicted_note = "no replica profile: the engine reports no histogram"
    assert answer.against(other) == ("the plan: no replica profile: the engine reports no "
                                     "histogram")
