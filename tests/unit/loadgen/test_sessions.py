"""User sessions on real sockets: a turn waits for the previous reply and the think time, the
reply's text goes back, users arrive or stay, Ctrl-C stops thinking users; and the pure
reading of the turns: returning turns, evictions, the working set, the tier against it."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core.errors import InputError
from kvlab.loadgen import returning
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.sessions import SessionSpec, ThinkTime
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import run_sweep
from kvlab.loadgen.workloads import Prompt
from kvlab.records import notebook, requests
from kvlab.records.models import LoadRecord
from kvlab.records.pressure import PressurePlanned
from kvlab.records.workload import ThinkTimeLine, Workload
from kvlab.report.offload import tier_fit


def spec(url: str, book: Path | None = None, **kw: Any) -> LoadSpec:
    values: dict[str, Any] = {"base_url": url, "model": "fake", "levels": (3,),
                              "requests": None, "max_tokens": 3, "prompt_set": "multi-turn",
                              "label": "users", "preamble_tokens": 30, "scrape_metrics": False,
                              "labbook": str(book) if book else "", "warmup": 0}
    values.update(kw)
    return LoadSpec(**values)


def test_think_time_forms(tmp_path: Path) -> None:
    import random

    assert ThinkTime.parse("2") == ThinkTime("fixed", 2.0)
    exp = ThinkTime.parse("exp:0.5")
    assert exp.kind == "exponential" and exp.mean_s == 0.5
    draws = [exp.sample(random.Random(i)) for i in range(400)]
    assert 0.4 < sum(draws) / len(draws) < 0.6 and len(set(draws)) > 300
    measured = tmp_path / "think.txt"
    measured.write_text("# seconds\n1.5\n\n0.5\n")
    from_file = ThinkTime.parse(f"trace:{measured}")
    assert from_file.mean_s == 1.0 and from_file.sample(random.Random(1)) in (1.5, 0.5)
    for bad in ("slow:1", "fixed:x", "fixed:-1", f"trace:{tmp_path / 'none.txt'}"):
        with pytest.raises(InputError, match="think"):
            ThinkTime.parse(bad)
    with pytest.raises(InputError, match="--turns"):
        SessionSpec(turns=0)


async def test_a_turn_waits_for_the_reply_and_the_think_time(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    s = SessionSpec(turns=3, think=ThinkTime("fixed", 0.2))
    async with SseUpstream(Behaviour(tokens=3, ttft_s=0.02)) as up:
        row = (await run_sweep(spec(up.base_url, book, sessions=s))).rows[0]
    assert (row.ok, row.requests, row.concurrency) == (9, 9, 3)
    assert row.workload == Workload(kind="sessions", users=3, turns=3,
                                    think_time=ThinkTimeLine(kind="fixed", mean_s=0.2),
                                    user_rate=None, arrivals="population")
    assert row.sessions is not None
    assert row.prompt_set == "sessions" and row.sessions.conversations == 3
    lines = requests.read(requests.location(book, str(row.requests_file)), row.requests_sha256)
    by_conv: dict[int, list[requests.RequestLine]] = {}
    for x in lines:
        assert x.conversation is not None and x.turn is not None
        by_conv.setdefault(x.conversation, []).append(x)
    assert len(by_conv) == 3
    for turns in by_conv.values():
        turns.sort(key=lambda x: x.turn or 0)
        assert [x.turn for x in turns] == [0, 1, 2]
        for before, after in itertools.pairwise(turns):
            assert after.sent_s is not None and before.end_s is not None
            assert after.sent_s >= before.end_s + 0.2  # the reply, then the think time
    # every later turn sent back the reply the server really gave, after its own question
    for body in up.counters.bodies:
        messages = body["messages"]
        turn = (len(messages) - 2) // 2
        assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * turn \
            + ["user"]
        assert all(m["content"] == " t0 t1 t2" for m in messages if m["role"] == "assistant")


async def test_users_arrive_at_a_rate_each_for_one_conversation() -> None:
    s = SessionSpec(turns=2, think=ThinkTime("fixed", 0.05), user_rate=20.0)
    async with SseUpstream(Behaviour(tokens=2)) as up:
        started = time.perf_counter()
        row = (await run_sweep(spec(up.base_url, levels=(6,), sessions=s))).rows[0]
    assert row.sessions is not None and row.workload is not None
    assert row.ok == 12 and row.sessions.conversations_started == 6
    assert row.workload.arrivals == "poisson"
    assert row.sessions.peak_active_users is not None
    assert 1 <= row.sessions.peak_active_users <= 6
    assert time.perf_counter() - started < 5


async def test_a_timed_level_starts_conversations_until_its_duration() -> None:
    s = SessionSpec(turns=2, think=ThinkTime("fixed", 0.05))
    async with SseUpstream(Behaviour(tokens=2)) as up:
        row = (await run_sweep(spec(up.base_url, levels=(2,), sessions=s,
                                    duration_s=0.8))).rows[0]
    assert row.sessions is not None and row.sessions.conversations_started is not None
    started = row.sessions.conversations_started
    assert started > 2 and row.ok == 2 * started  # every started conversation finished
    assert row.duration_s is not None and row.duration_s >= 0.8


async def test_ctrl_c_stops_thinking_users_and_cancels_what_is_in_flight() -> None:
    s = SessionSpec(turns=5, think=ThinkTime("fixed", 30.0))
    stop = asyncio.Event()
    async with SseUpstream(Behaviour(tokens=40, itl_s=0.05)) as up:
        asyncio.get_running_loop().call_later(0.5, stop.set)
        started = time.perf_counter()
        result = await run_sweep(spec(up.base_url, levels=(2,), sessions=s, max_tokens=40),
                                 stop=stop)
    assert time.perf_counter() - started < 5  # nobody waited out a 30 s think time
    row = result.rows[0]
    assert result.interrupted and row.interrupted is True
    assert row.cancelled is not None and row.ok is not None
    assert row.cancelled + row.ok == row.requests and row.failed == 0


def _turn(conv: int, turn: int, prompt: int, cached: int, end_s: float,
          output: int = 10) -> tuple[Prompt, RequestRecord]:
    index = conv * 10 + turn
    r = RequestRecord(index=index, prompt_index=index, sent_ns=1, end_ns=int(end_s * 1e9),
                      status=200, token_ns=[2], prompt_tokens=prompt, cached_tokens=cached,
                      completion_tokens=output)
    return Prompt(index, (), conversation=conv, turn=turn), r


def test_summary_counts_evictions_and_the_working_set() -> None:
    pairs = [_turn(0, 0, 300, 0, 1.0), _turn(0, 1, 420, 256, 2.0),  # held: 256 > 300 - 128
             _turn(1, 0, 500, 0, 1.5), _turn(1, 1, 600, 128, 2.5),  # lost a block: evicted
             _turn(1, 2, 700, 512, 3.0)]
    prompts = {p.index: p for p, _ in pairs}
    records = [r for _, r in pairs]
    got = returning.summary(records, prompts)
    assert (got.cache_block_tokens, got.cache_block_from[:8]) == (128, "inferred")
    assert (got.returning_turns, got.evicted_turns, got.held_turns) == (3, 1, 2)
    assert got.returning_hit_rate == round((256 + 128 + 512) / (420 + 600 + 700), 4)
    # at 2.0 s conversation 0 holds 420 + 10 and conversation 1 (from its turn 0) 500 + 10;
    # conversation 0 then ends, and conversation 1 alone never holds more
    assert got.working_set_tokens == 430 + 510
    # with a 16-token block each of those shortfalls is at least one whole block
    assert returning.summary(records, prompts, block_given=16).evicted_turns == 3
    assert returning.cache_block([0, 0], None) == (1, "no cached tokens were reported: one "
                                                     "token")


def test_the_tier_against_what_it_had_to_hold() -> None:
    # the H200 run's plan: a 32 GiB tier, a working set far beyond the device cache
    planned = PressurePlanned(host_tier_bytes=32 * 2**30, bytes_per_token=147_456.0,
                              working_set_tokens=700_000, cache_tokens=100_000,
                              kv_cache_bytes=100_000 * 147_456, oversubscription=7.0,
                              concurrency=16, requests=400, conversations=100, users=100,
                              conversation_tokens=7_000, reusable_fraction=0.7)
    said = tier_fit(planned)
    assert said is not None and said.startswith("the host tier (34.36 GB, 233,017 tokens) "
                                                "was smaller than the working set (700,000 "
                                                "tokens, 103.22 GB)")
    roomy = tier_fit(planned.model_copy(update={"host_tier_bytes": 100 * 2**30}))
    assert roomy is not None and roomy.startswith("the host tier (107.37 GB") and \
        "could hold" in roomy
    # no tier: nothing to say
    assert tier_fit(planned.model_copy(update={"host_tier_bytes": 0})) is None
    assert tier_fit(None) is None


async def test_rows_are_notebook_lines(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    s = SessionSpec(turns=2, think=ThinkTime("fixed", 0.0))
    async with SseUpstream(Behaviour(tokens=2)) as up:
        await run_sweep(spec(up.base_url, book, levels=(1, 2), sessions=s),
                        on_row=lambda r: notebook.append(book, r))
    rows = notebook.read(book).of(LoadRecord, "users")
    assert [r.concurrency for r in rows] == [1, 2]
    assert all(r.sessions is not None and r.workload is not None for r in rows)


async def test_a_paced_think_time_takes_its_mean_from_the_warm_up() -> None:
    paced = ThinkTime.parse("paced:2")
    assert (paced.kind, paced.in_flight) == ("paced", 2)
    resolved = paced.paced_for(users=8, request_s=0.5)
    assert (resolved.kind, resolved.mean_s) == ("exponential", 0.5 * (8 / 2 - 1))
    assert paced.paced_for(users=2, request_s=0.5).mean_s == 0  # all of them may be in flight
    with pytest.raises(InputError, match="paced:N"):
        ThinkTime.parse("paced:0")
    s = SessionSpec(turns=2, think=paced)
    async with SseUpstream(Behaviour(tokens=2, ttft_s=0.05)) as up:
        row = (await run_sweep(spec(up.base_url, levels=(4,), sessions=s, warmup=2))).rows[0]
    assert row.workload is not None and row.workload.think_time is not None
    think = row.workload.think_time
    assert think.kind == "exponential" and think.source is not None
    assert think.source.startswith("paced: about 2 of 4")
    assert think.source.endswith("(a warm-up request sent alone)")
    assert 0.05 <= think.mean_s <= 0.2  # that request's time, times (4 / 2 - 1)
    assert row.ok == 8


async def test_a_paced_think_time_comes_from_one_request_sent_alone_before_the_level() -> None:
    """The warm-up sends all its requests at once, so even its fastest waited on the others
    (on two CPU cores 2.4 s against 0.3 s alone): pacing takes one more warm-up request sent
    alone, before the level's first scrape, so it is in none of the level's figures."""
    s = SessionSpec(turns=2, think=ThinkTime.parse("paced:2"))
    async with SseUpstream(Behaviour(tokens=2, ttft_s=0.05)) as up:
        row = (await run_sweep(spec(up.base_url, levels=(8,), sessions=s, warmup=8))).rows[0]
        sent = up.counters.requests
    think = row.workload.think_time if row.workload is not None else None
    assert think is not None and think.source is not None
    assert think.source.endswith("(a warm-up request sent alone)")
    assert row.ok == 16 and sent == 8 + 1 + 16


def test_the_pressure_plan_sizes_users_and_the_tier_against_the_working_set() -> None:
    from kvlab.experiments.pressure_plan import OVERSUBSCRIPTION, plan_pressure

    p = plan_pressure("Qwen/Qwen3-8B", 8, 4096, 128, 147_456, ctx=8192, block_size=16)
    assert p.users * p.conversation_tokens == p.working_set_tokens  # the users' live ones
    assert p.working_set_tokens >= OVERSUBSCRIPTION * p.cache_tokens * 0.95
    assert p.tier_tokens_needed == p.working_set_tokens  # the tier copies what it stores
    needed_gb = p.tier_bytes_needed / 2**30
    assert p.tier_gb(4.0) == float(-(-p.tier_bytes_needed // 2**30)) > needed_gb > 4
    assert p.tier_gb(1000.0) == 1000.0  # a larger tier asked for is kept
    assert p.as_record().tier_tokens_needed == p.tier_tokens_needed


def test_the_tier_on_run_thinks_as_long_as_the_tier_off_run() -> None:
    from kvlab.experiments.offload import think_of
    from kvlab.records.models import NotRunRecord

    paced = {"kind": "exponential", "mean_s": 2.9637, "source": "paced: about 8 of 37"}
    rows = [LoadRecord(label="offload-off-load", lab="x", concurrency=37, requests=148,
                       workload={"kind": "sessions", "think_time": paced})]
    assert think_of(rows) == 2.9637
    assert think_of([NotRunRecord(label="x", lab="x", row="r", reason="no")]) is None
