"""Why the host tier cost time, read from the notebook (#46): the parts, each from its own
lines, and the cause named only where the control isolates it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvlab.records import (
    PRESSURE_OFF,
    PRESSURE_OFF_DISTINCT,
    PRESSURE_ON,
    PRESSURE_ON_DISTINCT,
    CopyRateRecord,
    LoadRecord,
    Percentiles,
    TtftAccount,
    notebook,
    requests,
)
from kvlab.report import why_tier

SOURCE = "vLLM's request-time histograms"


def _ttfts(seed: int, n: int, median: float) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(v) for v in rng.lognormal(np.log(median), 0.2, n)]


def row(book: Path, label: str, first: float, later: float, seed: int,
        account: TtftAccount | None = None, **deltas: float) -> LoadRecord:
    """A session run of 40 first turns and 80 later ones with these TTFT medians."""
    values = [(0, t) for t in _ttfts(seed, 40, first)] + \
        [(1, t) for t in _ttfts(seed + 1, 80, later)]
    lines = [requests.RequestLine(id=i, level=8, status="ok", sent_s=0.0, first_token_s=t,
                                  end_s=t + 0.1, ttft_s=t, tpot_s=0.01, output_tokens=11,
                                  turn=turn, conversation=i % 40)
             for i, (turn, t) in enumerate(values)]
    relative = f"{requests.REQUESTS_DIR}/{label}.jsonl"
    digest = requests.write(book.parent / relative, lines)
    p50 = float(np.median([t for _, t in values]))
    out = LoadRecord(label=label, lab=notebook.LAB_OFFLOAD, concurrency=8, requests=120,
                     ok=120, failed=0, model="m", prompt_set="sessions", max_tokens=11,
                     ttft_s=Percentiles(p50=p50), requests_file=relative,
                     requests_sha256=digest, metric_deltas=dict(deltas),
                     ttft_account=account)
    notebook.append(book, out)
    return out


def account(client: float, queue: float, prefill: float) -> TtftAccount:
    return TtftAccount(source=SOURCE, requests=120, client_ttft=client, queue=queue,
                       prefill=prefill, engine_ttft=queue + prefill,
                       outside=client - queue - prefill)


def pair(book: Path) -> tuple[LoadRecord, LoadRecord]:
    off = row(book, PRESSURE_OFF.label, 0.08, 0.10, 1, account(0.119, 0.039, 0.077),
              prompt_tokens_local_compute=60_000.0)
    on = row(book, PRESSURE_ON.label, 0.35, 0.30, 3, account(0.427, 0.302, 0.121),
             offload_load_s=0.176, offload_load_bytes=5.9e9,
             external_prefix_cache_hits=40_000.0)
    return on, off


def test_a_tax_that_goes_with_the_shared_block_is_named_with_its_figures(
        tmp_path: Path) -> None:
    book_path = tmp_path / "labbook.md"
    on, off = pair(book_path)
    row(book_path, PRESSURE_OFF_DISTINCT.label, 0.08, 0.10, 5)
    row(book_path, PRESSURE_ON_DISTINCT.label, 0.081, 0.12, 7)
    notebook.append(book_path, CopyRateRecord(
        lab=notebook.LAB_OFFLOAD, label="copy-rate", direction="host-to-device",
        bytes=2**26, copies=8, best_s=0.0013, gb_per_s=51.6, framework="torch 2.11",
        device="H200", source="measured"))
    words = why_tier.cause(notebook.read(book_path), on, off)
    assert "waiting to be scheduled +0.263 s" in words
    assert "computing the prompt +0.044 s" in words
    assert "loads took 0.176 s in all for 5.90 GB" in words
    assert "against 37.0 s added over the level's 120 requests" in words
    assert "first turns, which recall nothing, TTFT p50" in words and "slower" in words
    assert "with no block shared across conversations, first turns" in words
    assert "0.114 s" in words  # 5.9 GB at 51.6 GB/s
    assert "to recompute its 40,000 tokens at the tier-off run's 154 µs a token" in words
    assert words.endswith(why_tier.TRY_CONVOY) and "Cause: " + why_tier.CONVOY in words


def test_a_tax_that_stays_without_the_shared_block_is_unexplained(tmp_path: Path) -> None:
    book_path = tmp_path / "labbook.md"
    on, off = pair(book_path)
    row(book_path, PRESSURE_OFF_DISTINCT.label, 0.08, 0.10, 5)
    row(book_path, PRESSURE_ON_DISTINCT.label, 0.33, 0.3, 7)
    words = why_tier.cause(notebook.read(book_path), on, off)
    assert "Unexplained: first turns were slower with no block shared as well" in words
    assert "so are the copies' own time" in words and "Cause:" not in words


def test_without_the_control_the_hold_is_a_lead(tmp_path: Path) -> None:
    book_path = tmp_path / "labbook.md"
    on, off = pair(book_path)
    words = why_tier.cause(notebook.read(book_path), on, off)
    assert "the hold is a lead, not a finding" in words and "Cause:" not in words
    assert "the floor" not in words  # no copy-rate line: said nowhere, not guessed


def test_rows_without_accounts_or_files_say_nothing(tmp_path: Path) -> None:
    book_path = tmp_path / "labbook.md"
    bare = [LoadRecord(label=label, lab=notebook.LAB_OFFLOAD, concurrency=8, requests=4,
                       ok=4, model="m", prompt_set="sessions", max_tokens=8)
            for label in (PRESSURE_ON.label, PRESSURE_OFF.label)]
    for r in bare:
        notebook.append(book_path, r)
    assert why_tier.cause(notebook.read(book_path), *bare) == ""


def test_the_committed_reports_say_why_and_no_figure_contradicts_its_word() -> None:
    """The CPU demo's and the H200 quick pass's notebooks, as committed: the store that did not
    pay no longer shows a faster turn 2 as its figure, and the tier that cost time says where
    the time went and that the hold is a lead until the control runs."""
    from kvlab.report import decisions_host, decisions_tiers

    docs = Path(__file__).resolve().parents[3] / "docs"
    demo = notebook.read(docs / "examples/cpu-demo/notebook.jsonl")
    store = decisions_tiers.store(demo)
    assert store.headline == "The store did not pay"
    assert store.figure == "turn 2 took 0 prompt tokens from the store"
    assert "so its 0.160 s against turn 1's 0.338 s is not the store's doing" in store.answer
    quick = notebook.read(docs / "validation/h200-run-all/quick-2026-12-07/notebook.jsonl")
    tier = decisions_host.host_tier(quick).answer
    assert "Why: mean TTFT 0.427 s against 0.119 s (+0.308 s): waiting to be scheduled " \
        "+0.264 s" in tier
    assert "the tier's loads took 0.176 s in all for 5.91 GB" in tier
    assert "first turns, which recall nothing, TTFT p50 2.32x" in tier
    assert "the hold is a lead, not a finding" in tier
