"""The slot store's one round trip and its one judge, without a server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvlab.core.say import Say
from kvlab.core.settings import Settings
from kvlab.engines.base import InstanceFacts
from kvlab.engines.llamacpp import prove as llama_prove
from kvlab.engines.llamacpp import roundtrip, slotstore
from kvlab.engines.llamacpp.client import SlotOp
from kvlab.engines.llamacpp.roundtrip import Asks, Slot, judge
from kvlab.measure.prove import Expect, ProofRun, ProveOptions, _Prover, own_proof
from kvlab.observe.chat import ChatResult

TOP = [(" a", -7.1), (" b", -7.3)]


def chat(cache_n: int, prompt_n: int, top: list[tuple[str, float]] = TOP) -> ChatResult:
    return ChatResult(endpoint="e", ttft_s=0.1, total_s=0.2, chunks=1, text="x",
                      timings={"cache_n": cache_n, "prompt_n": prompt_n}, first_logprobs=top)


COLD, CLEAN = chat(0, 3500), chat(0, 3500)
RESTORED = chat(3499, 1, [(" a", -7.1002), (" b", -7.3001)])


def test_proven_needs_reuse_a_clean_control_and_equal_logprobs() -> None:
    judged = judge(COLD, CLEAN, RESTORED)
    assert (judged.verdict, judged.reasons, judged.prompt_tokens) == ("reuse proven", [], 3500)
    assert judged.logprob_gap == pytest.approx(2e-4)


def test_each_failure_is_named() -> None:
    faked = judge(COLD, chat(3499, 1), RESTORED)
    assert faked.verdict == "not proven" and "control reused 3499" in faked.reasons[0]
    assert "only 10 of 3500" in judge(COLD, CLEAN, chat(10, 3490)).reasons[0]
    assert "logprobs differ" in judge(COLD, CLEAN, chat(3499, 1, [(" a", -7.05)])).reasons[0]
    assert "missing" in judge(COLD, CLEAN, chat(3499, 1, [])).reasons[0]
    swapped = judge(chat(0, 3500, [(" a", -1.0), (" b", -1.0005)]), CLEAN,
                    chat(3499, 1, [(" b", -1.0005), (" a", -1.0)]))
    assert "most likely first token differs" in swapped.reasons[0]


def test_the_thresholds_are_the_edges() -> None:
    assert judge(COLD, chat(175, 3325), chat(3325, 175)).verdict == "reuse proven"
    assert judge(COLD, chat(176, 3324), RESTORED).verdict == "not proven"
    assert judge(COLD, CLEAN, chat(3324, 176)).verdict == "not proven"


@dataclass
class FakeClient:
    events: list[str]

    async def erase(self, slot: int) -> SlotOp:
        self.events.append(f"erase {slot}")
        return SlotOp("erase", slot, None, 0, None, None, 0.1)


def op(action: str, slot: int) -> SlotOp:
    return SlotOp(action, slot, "f.bin", 3500, 1000, 1.0, 2.0)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    async def save(client: Any, store: Any, slot: int, name: str,
                   hash_cache: Path | None = None) -> tuple[SlotOp, Any]:
        seen.append(f"save {slot} {name}")
        return op("save", slot), "manifest"

    async def restore(client: Any, store: Any, slot: int, name: str,
                      hash_cache: Path | None = None) -> tuple[SlotOp, Any]:
        seen.append(f"restore {slot} {name}")
        return op("restore", slot), "manifest"

    monkeypatch.setattr(slotstore, "save", save)
    monkeypatch.setattr(slotstore, "restore", restore)
    return seen


def asks(events: list[str], before: bool) -> Asks:
    def ask(name: str, result: ChatResult) -> roundtrip.Ask:
        async def send() -> ChatResult:
            events.append(name)
            return result
        return send
    return Asks(ask("cold", COLD), ask("again", RESTORED), ask("control", CLEAN), before)


async def test_one_server_controls_on_the_erased_slot_before_the_restore(
        events: list[str], tmp_path: Path) -> None:
    here = Slot(FakeClient(events), 0)  # type: ignore[arg-type]
    trip = await roundtrip.round_trip(slotstore.SlotStore(tmp_path), "f.bin", here, here,
                                      asks(events, before=True))
    assert events == ["cold", "save 0 f.bin", "erase 0", "control", "erase 0",
                      "restore 0 f.bin", "again"]
    assert (trip.cold, trip.control, trip.restored) == (COLD, CLEAN, RESTORED)


async def test_two_servers_control_last(events: list[str], tmp_path: Path) -> None:
    a, b = Slot(FakeClient(events), 0), Slot(FakeClient(events), 0)  # type: ignore[arg-type]
    said: list[str] = []
    trip = await roundtrip.round_trip(slotstore.SlotStore(tmp_path), "f.bin", a, b,
                                      asks(events, before=False), say=said.append)
    assert events == ["cold", "save 0 f.bin", "restore 0 f.bin", "again", "control"]
    assert trip.save.action == "save" and trip.restore.action == "restore"
    assert said == ["saved 3500 tokens (1000 bytes) in 2.0 ms", "restored 3500 tokens in 2.0 ms"]


def test_the_slot_store_proof_is_the_llama_adapters_own() -> None:
    def facts(*engines: str | None) -> dict[str, InstanceFacts]:
        return {f"u{i}": InstanceFacts(url=f"u{i}", engine=e) for i, e in enumerate(engines)}

    assert own_proof(facts("llama.cpp", "llama.cpp")) is llama_prove.slot_store_proof
    for engines in (("vllm", "vllm"), ("llama.cpp", "vllm"), (None, None), ()):
        assert own_proof(facts(*engines)) is None


@dataclass
class Asked:
    result: ChatResult


@dataclass
class FakeRunner:
    """prove's case runner, as the llama proof sees it."""

    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    nonce: str = "n0"

    def __post_init__(self) -> None:
        self.say: Say = self.said.append

    async def cold(self, name: str, url: str, **extra: Any) -> Asked:
        self.calls.append((name, url, extra))
        return Asked(COLD)

    async def identical(self, name: str, url: str, why: str, **extra: Any) -> Asked:
        self.calls.append((name, url, extra))
        return Asked(RESTORED)

    async def control(self, name: str, url: str, why: str, **extra: Any) -> Asked:
        self.calls.append((name, url, extra))
        return Asked(chat(3, 3497))

    def explain(self, text: str) -> None:
        self.explained.append(text)


async def test_llama_proof_runs_the_round_trip_through_prove_cases(
        events: list[str], tmp_path: Path) -> None:
    settings = Settings(kvlab_home=str(tmp_path / "home"),
                        llama_slot_save_path=str(tmp_path / "slots"))
    runner = FakeRunner()
    await llama_prove.slot_store_proof(runner, "http://127.0.0.1:18001/v1",
                                       "http://127.0.0.1:18002/v1", settings)
    assert [(n, u.rsplit(":", 1)[1], e.get("id_slot")) for n, u, e in runner.calls] == [
        ("cold-on-a", "18001/v1", 0), ("identical-on-b", "18002/v1", 0),
        ("changed-prefix-on-b", "18002/v1", 1)]
    assert runner.calls[0][2]["logprobs"] is True  # the logprob evidence is asked for
    assert events == ["save 0 kvlab-prove-n0.bin", "restore 0 kvlab-prove-n0.bin"]
    assert "reuse proven" in runner.explained[-1]
    assert all(s.startswith("    slot file: ") for s in runner.said)


async def test_expectations_are_resolved_once_the_prompt_is_known() -> None:
    url = "http://h:1/v1"
    opts = ProveOptions(urls=[url, "http://h:2/v1"], model="m", connector="shared")
    run = ProofRun(opts, nonce="n", instances={url: InstanceFacts(url=url, block_size=16)})
    async with httpx.AsyncClient() as client:
        p = _Prover(opts, client, run, say=lambda _: None)
        assert p._expected(Expect.tokens(0, "why"), 1553, url) == (0, "why")
        assert p._expected(Expect.reusable(), 1553, url) == (1552, "")
        want, why = p._expected(Expect.store([1332]), 1500, url)
        assert want == 0 and "exact" in why.lower()
