"""The proxy's routing layer: affinity keys, the bounded ring, plain replicas, dead legs.

Pure functions first (keys, ring, load bound); then a proxy of plain replicas on loopback with
the fault-injection fakes: each request goes whole to one replica, affinity keeps a prefix on
one replica, and a replica that stops answering is left out with its failures counted.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fakes.fault_upstream import FaultUpstream
from kvlab.core.errors import RefusedError, SettingError
from kvlab.engines.models import make_tiny
from kvlab.engines.ports import free_port
from kvlab.loadgen import workloads
from kvlab.proxy import ProxyConfig, running
from kvlab.proxy import affinity as aff
from kvlab.proxy.legs import LegPool, PickLog


@dataclass
class FakeLeg:
    outstanding: int = 0
    down: bool = False

    def up(self, now: float) -> bool:
        return not self.down


def chat(messages: list[tuple[str, str]], **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages],
            **extra}


def test_ring_walks_every_replica_once_and_alike_in_every_process() -> None:
    ring = aff.Ring(["a:1", "b:2", "c:3"])
    for key in (0, 1, 2**63, 2**64 - 1, aff.digest(b"x")):
        order = ring.walk(key)
        assert sorted(order) == [0, 1, 2]
    assert aff.Ring(["a:1", "b:2", "c:3"]).walk(12345) == ring.walk(12345)


def test_ring_spreads_keys_near_evenly() -> None:
    ring = aff.Ring([f"10.0.0.{i}:8000" for i in range(8)])
    owners = Counter(ring.walk(aff.digest(str(k).encode()))[0] for k in range(8000))
    assert max(owners.values()) / min(owners.values()) < 1.6


def test_bounded_choice_keeps_a_key_until_its_replica_is_at_the_bound() -> None:
    ring = aff.Ring(["a", "b", "c"])
    legs = [FakeLeg(), FakeLeg(), FakeLeg()]
    key = aff.digest(b"preamble")
    home, second = ring.walk(key)[:2]
    assert aff.bounded_choice(ring, key, legs, 1.25, 0.0) == home
    legs[home].outstanding = aff.MIN_BOUND - 1  # at low load the floor keeps it home
    assert aff.bounded_choice(ring, key, legs, 1.25, 0.0) == home
    legs[home].outstanding = 8  # 9 in flight: ceil(1.25 x 9 / 3) = 4, home is over
    assert aff.bounded_choice(ring, key, legs, 1.25, 0.0) == second
    for i, leg in enumerate(legs):
        leg.outstanding = 8 if i != home else 10  # 27 in flight: the bound is 12
    assert aff.bounded_choice(ring, key, legs, 1.25, 0.0) == home


def test_bounded_choice_skips_a_dead_replica_and_needs_one_alive() -> None:
    ring = aff.Ring(["a", "b", "c"])
    key = aff.digest(b"k")
    home = ring.walk(key)[0]
    legs = [FakeLeg(), FakeLeg(), FakeLeg()]
    legs[home].down = True
    assert aff.bounded_choice(ring, key, legs, 1.25, 0.0) == ring.walk(key)[1]
    for leg in legs:
        leg.down = True
    assert aff.bounded_choice(ring, key, legs, 1.25, 0.0) == home


def test_conversation_key_follows_a_conversation_as_it_grows() -> None:
    turns = workloads.build("multi-turn", 6, preamble_tokens=64, conversations=2, turns=3)
    keys = {(p.conversation, aff.conversation_key(chat(list(p.messages)))) for p in turns}
    assert len(keys) == 2 and len({k for _, k in keys}) == 2
    same = chat([("user", "hi")], user="alice")
    assert aff.conversation_key(same) == aff.conversation_key(
        chat([("user", "other")], user="alice"))
    assert aff.conversation_key({"prompt": "a\nb"}) == aff.conversation_key({"prompt": "a\nc"})


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny(tmp_path_factory.mktemp("tiny")).hf


def test_prefix_key_is_one_per_shared_preamble(tokenizer_dir: str) -> None:
    key = aff.PrefixKey(aff.load_tokenizer(tokenizer_dir), block_tokens=16, blocks=4)
    prompts = workloads.build("shared-prefix", 40, preamble_tokens=256, shares=(0.5, 0.5))
    by_group: dict[int | None, set[int]] = {}
    for p in prompts:
        by_group.setdefault(p.group, set()).add(key(chat(list(p.messages))))
    assert [len(v) for v in by_group.values()] == [1, 1]
    assert len(set.union(*by_group.values())) == 2
    assert key({"prompt": "short"}) != key({"prompt": "shorter"})


def test_prefix_key_reads_only_the_leading_text(tokenizer_dir: str) -> None:
    key = aff.PrefixKey(aff.load_tokenizer(tokenizer_dir), block_tokens=16, blocks=2)
    head = workloads.preamble(0, 200)
    assert key({"prompt": head + " one"}) == key({"prompt": head + " two" * 5000})


def test_load_tokenizer_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="--tokenizer"):
        aff.load_tokenizer(str(tmp_path))


def test_config_refuses_affinity_without_what_it_needs() -> None:
    with pytest.raises(SettingError, match="--tokenizer"):
        ProxyConfig(prefill=(), decode=("127.0.0.1:1",), balance="prefix-affinity")
    with pytest.raises(SettingError, match="--load-factor"):
        ProxyConfig(prefill=(), decode=("127.0.0.1:1",), load_factor=0.5)
    with pytest.raises(RefusedError, match="--balance conversation"):
        LegPool("decode", ("127.0.0.1:1",), "conversation-affinity", 1.0)


def test_a_failed_leg_sits_out_and_is_counted() -> None:
    pool = LegPool("decode", ("127.0.0.1:1", "127.0.0.1:2"), "round-robin", 1.0)
    first = pool.pick()
    pool.done(first)
    first.failed("unavailable")
    picks = [pool.pick() for _ in range(4)]
    assert all(p is not first for p in picks)
    assert first.failures == 1 and first.picked == 1
    other = pool.legs[1]
    other.failed("timeout")  # alive, only slow: stays in
    assert other.up(float("inf"))


def test_pick_log_names_each_choice(tmp_path: Path) -> None:
    log_path = tmp_path / "picks.jsonl"
    pool = LegPool("decode", ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"),
                   "conversation-affinity", 1.0, keyer=aff.conversation_key,
                   log=PickLog(str(log_path)))
    body = chat([("system", "s"), ("user", "first")])
    count = aff.MIN_BOUND + 1
    legs = [pool.pick(body, b"r%d" % i) for i in range(count)]
    pool.close()
    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert [x["rid"] for x in lines] == [f"r{i}" for i in range(count)]
    # nothing finished in between: home takes MIN_BOUND, the next goes on along the ring
    home, second = pool.ring.walk(aff.conversation_key(body))[:2]
    assert [x["leg"] for x in lines] == [home] * aff.MIN_BOUND + [second]
    assert legs[-1] is not legs[0]
    assert {x["body"] for x in lines} == {aff.body_digest(body)}
    assert oct(log_path.stat().st_mode & 0o777) == "0o600"


async def test_plain_replicas_serve_each_request_whole_on_one() -> None:
    async with FaultUpstream() as a, FaultUpstream() as b, FaultUpstream() as c:
        config = ProxyConfig(prefill=(), decode=(a.url, b.url, c.url), port=0, compat=None,
                             balance="conversation-affinity")
        async with running(config) as app, httpx.AsyncClient(
                base_url=app.url, trust_env=False, timeout=10) as client:
            for turn in range(3):
                body = chat([("system", "s"), ("user", "open")] +
                            [("user", f"q{t}") for t in range(turn)], max_tokens=4)
                answer = await client.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200
            served = [len(u.generations()) for u in (a, b, c)]
            assert sorted(served) == [0, 0, 3]
            whole = next(u for u in (a, b, c) if u.generations()).generations()
            assert all(s.body.get("max_tokens") == 4 for s in whole)  # not a 1-token prefill
            assert [leg.picked for leg in app.decode.legs] == served


async def test_a_dead_replica_is_routed_around_with_its_failures_counted() -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with FaultUpstream() as a, FaultUpstream() as b:
        config = ProxyConfig(prefill=(), decode=(a.url, dead, b.url), port=0, compat=None)
        async with running(config) as app, httpx.AsyncClient(
                base_url=app.url, trust_env=False, timeout=10) as client:
            codes = [(await client.post("/v1/completions", json={
                "model": "m", "prompt": "p", "max_tokens": 2})).status_code for _ in range(9)]
            await asyncio.sleep(0)
        assert codes.count(503) == 1 and codes.count(200) == 8
        assert app.decode.legs[1].failures == 1 and app.decode.legs[1].picked == 1
        assert len(a.generations()) + len(b.generations()) == 8
