"""Trace replay: the Mooncake format read and refused, prompts whose blocks follow the hash
ids token for token, the trace's timing on real sockets, and what an infinite cache reuses."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core.errors import InputError
from kvlab.loadgen import trace
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.inputs import Inputs
from kvlab.loadgen.level import measure_level
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import run_sweep
from kvlab.loadgen.trace import TokenPool, TraceRequest, TraceSpec
from kvlab.records.workload import Workload

POOL = TokenPool(tuple(range(1000, 1400)), "a test pool")
# the first lines of Mooncake's FAST25-release/traces/conversation_trace.jsonl, shortened
MOONCAKE = [
    {"timestamp": 0, "input_length": 6758, "output_length": 500,
     "hash_ids": list(range(14))},
    {"timestamp": 0, "input_length": 7322, "output_length": 490,
     "hash_ids": [0, *range(14, 28)]},
    {"timestamp": 3000, "input_length": 2012, "output_length": 354,
     "hash_ids": [0, 427, 428, 429]},
]


def write(path: Path, objs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def test_reads_the_mooncake_format(tmp_path: Path) -> None:
    spec = TraceSpec(str(write(tmp_path / "t.jsonl", MOONCAKE)))
    got = trace.read(spec)
    assert [r.input_length for r in got.requests] == [6758, 7322, 2012]
    assert got.requests[2].hash_ids == (0, 427, 428, 429)
    assert got.offsets_ns(2.0) == (0, 0, 1_500_000_000)  # twice as fast
    assert len(got.sha256) == 64 and got.left_out == 0
    short = trace.read(TraceSpec(spec.path, max_input=7000, limit=1))
    assert [r.input_length for r in short.requests] == [6758]
    left = trace.read(TraceSpec(spec.path, max_input=7000, over="filter"))
    assert left.left_out == 1 and len(left.requests) == 2
    # an infinite cache: request 2 finds block 0 held; the third too, and no more
    assert trace.reusable_blocks(got.requests, 512) == [0, 1, 1]
    described = trace.describe(spec, got, POOL, max_tokens=400)
    assert described.outputs_capped == 2 and described.distinct_blocks == 31
    assert described.reusable_fraction_infinite_cache == round(2 * 512 / 16092, 4)


def test_a_prompt_held_whole_reuses_all_but_its_last_block() -> None:
    """#48 finding 10: a Mooncake replay cut to 2,048 tokens said an infinite cache would reuse
    35.4%, 0.6 points above what a roomy vLLM cache served: prompts cut to whole blocks and
    held whole still compute their last token, so their last block is not a hit."""
    made = [TraceRequest(0, 1024, 1, (1, 2)), TraceRequest(1, 1024, 1, (1, 2)),
            TraceRequest(2, 1025, 1, (1, 2, 3))]
    assert trace.reusable_blocks(made, 512) == [0, 1, 2]


def test_the_first_n_requests_are_the_files_first_n_cut_or_left_out(tmp_path: Path) -> None:
    """--trace-limit counts the file's requests, before any is left out: "the first 2" of a
    trace whose second request is too long are never its first and third (which doubled the
    reuse of a real replay). Truncation keeps every request, its blocks cut to fit, and the
    reuse is counted on what is sent."""
    path = write(tmp_path / "t.jsonl", MOONCAKE)
    filtered = trace.read(TraceSpec(path=str(path), max_input=7000, limit=2, over="filter"))
    assert [r.input_length for r in filtered.requests] == [6758]
    assert (filtered.left_out, filtered.truncated) == (1, 0)
    cut = trace.read(TraceSpec(str(path), max_input=7000, limit=2))  # truncate, the default
    assert [r.input_length for r in cut.requests] == [6758, 7000]
    assert (cut.left_out, cut.truncated) == (0, 1)
    assert cut.requests[1].hash_ids == (0, *range(14, 27))  # ceil(7000 / 512) = 14 blocks
    said = trace.describe(TraceSpec(str(path), max_input=7000, limit=2), cut)
    assert (said.requests, said.limit, said.max_input, said.over_max_input) == \
        (2, 2, 7000, "truncate")
    assert (said.truncated_to_max_input, said.left_out_over_max_input) == (1, 0)
    # the second request finds block 0 held: one block of the 13,758 tokens sent
    assert said.reusable_fraction_infinite_cache == round(512 / (6758 + 7000), 4)
    # a cut request's prompt is the first tokens of the uncut one: the same blocks, shorter
    whole = trace.read(TraceSpec(str(path), limit=2)).requests[1]
    assert trace.prompt_tokens(cut.requests[1], 1, POOL, 1, 0, 512) == \
        trace.prompt_tokens(whole, 1, POOL, 1, 0, 512)[:7000]


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "not a JSON line"), ('{"timestamp": 0}', "no 'input_length'"),
    ('{"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": []}', "numbers"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "at least 1"),
    ("[1, 2]", "JSON object"),
])
def test_a_bad_line_is_refused_with_its_number(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(MOONCAKE[0]) + "\n" + line + "\n")
    with pytest.raises(InputError, match=f"t.jsonl:2: .*{message}"):
        trace.read(TraceSpec(str(path)))


def test_refuses_what_cannot_be_replayed(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        trace.read(TraceSpec(str(tmp_path / "missing.jsonl")))
    with pytest.raises(InputError, match="no request"):
        trace.read(TraceSpec(str(write(tmp_path / "t.jsonl", MOONCAKE)), max_input=10,
                              over="filter"))
    for bad in ({"block_tokens": 0}, {"speedup": 0.0}, {"limit": 0}):
        with pytest.raises(InputError, match="--trace"):
            TraceSpec("x", **bad)
    with pytest.raises(InputError, match="--endpoint completions"):
        LoadSpec(base_url="http://127.0.0.1:1/v1", model="m", levels=(1,), requests=None,
                 max_tokens=4, prompt_set="mixed", label="t", trace=TraceSpec("x"))


def test_blocks_follow_the_hash_ids_token_for_token() -> None:
    a = TraceRequest(0, 300, 4, (7, 8, 9))  # two whole blocks of 128, then 44 of block 9
    b = TraceRequest(0, 400, 4, (7, 8, 10, 11))
    ta = trace.prompt_tokens(a, 0, POOL, seed=1, salt=0, block_tokens=128)
    tb = trace.prompt_tokens(b, 1, POOL, seed=1, salt=0, block_tokens=128)
    assert (len(ta), len(tb)) == (300, 400)
    assert ta[:256] == tb[:256] and ta[256:] != tb[256:300]  # blocks 7 and 8 shared, exactly
    full = TraceRequest(0, 384, 4, (7, 8, 9))
    assert trace.prompt_tokens(full, 2, POOL, 1, 0, 128)[:300] == ta  # a cut block: its start
    assert set(ta) <= set(POOL.tokens)
    # another replay (salt) shares nothing with the first; tokens past the ids are the request's
    assert trace.prompt_tokens(a, 0, POOL, 1, 5, 128)[:128] != ta[:128]
    long = TraceRequest(0, 200, 4, (7,))
    tail = trace.prompt_tokens(long, 3, POOL, 1, 0, 128)
    assert tail[:128] == ta[:128] and len(tail) == 200


def test_a_generated_trace_has_shared_roots_and_exact_lengths(tmp_path: Path) -> None:
    made = trace.synthetic(30, groups=3, shared_blocks=2, own_blocks=(1, 3), block_tokens=64,
                           rate=10.0, seed=4)
    assert [r.timestamp_ms for r in made] == sorted(r.timestamp_ms for r in made)
    roots = {r.hash_ids[:2] for r in made}
    assert len(roots) == 3
    for r in made:
        assert -(-r.input_length // 64) == len(r.hash_ids)  # Mooncake: ceil(length / block)
    owns = [h for r in made for h in r.hash_ids[2:]]
    assert len(owns) == len(set(owns))  # a request's own blocks are its own
    back = trace.read(TraceSpec(str(trace.write(tmp_path / "g.jsonl", made)), 64))
    assert list(back.requests) == made
    reuse = trace.reusable_blocks(made, 64)
    assert reuse[0] == 0 and all(n == 2 for r, n in zip(made[1:], reuse[1:], strict=True)
                                 if r.hash_ids[:2] in {m.hash_ids[:2] for m in made[:1]})


async def test_replay_sends_token_prompts_at_the_trace_times(tmp_path: Path) -> None:
    made = [TraceRequest(0, 200, 3, (1, 2)), TraceRequest(300, 150, 9, (1, 3)),
            TraceRequest(600, 100, 2, (4,))]
    spec = TraceSpec(str(trace.write(tmp_path / "t.jsonl", made)), block_tokens=128,
                     speedup=2.0)
    async with SseUpstream(Behaviour(tokens=2)) as up:
        load = LoadSpec(base_url=up.base_url, model="fake", levels=(8,), requests=None,
                        max_tokens=5, prompt_set="mixed", label="tr", scrape_metrics=False,
                        endpoint="completions", trace=spec, warmup=1)
        started = time.perf_counter()
        got = await measure_level(load, Endpoint.from_url(up.base_url), 8, 0,
                                  inputs=Inputs(pool=POOL, trace=trace.read(spec)))
        took = time.perf_counter() - started
    bodies = up.counters.bodies
    warm, measured = bodies[0], bodies[1:]
    assert len(warm["prompt"]) == 16 and warm["max_tokens"] == 1
    assert [len(b["prompt"]) for b in measured] == [200, 150, 100]
    assert [b["max_tokens"] for b in measured] == [3, 5, 2]  # the trace's, capped at 5
    assert all(b["ignore_eos"] is True and "messages" not in b for b in bodies)
    assert measured[0]["prompt"][:128] == measured[1]["prompt"][:128]  # hash id 1, shared
    sent = sorted(r.sent_ns for r in got.result.records)
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(sent)]
    assert all(0.13 <= g <= 0.3 for g in gaps), gaps  # 300 ms apart at twice the speed
    assert took < 3 and got.row.trace is not None
    assert got.row.trace.requests == 3 and got.row.arrivals == "trace"
    assert got.row.workload == Workload(kind="trace", in_flight_cap=8)


async def test_without_a_tokenizer_a_trace_is_refused(tmp_path: Path) -> None:
    spec = TraceSpec(str(write(tmp_path / "t.jsonl", MOONCAKE)))
    async with SseUpstream(Behaviour(tokens=2)) as up:
        load = LoadSpec(base_url=up.base_url, model="fake", levels=(8,), requests=None,
                        max_tokens=5, prompt_set="mixed", label="tr", scrape_metrics=False,
                        endpoint="completions", trace=spec)
        with pytest.raises(InputError, match="no /tokenize answered"):
            await run_sweep(load)
    assert up.counters.requests == 0
