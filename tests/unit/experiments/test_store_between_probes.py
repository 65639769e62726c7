"""A capacity search through the shared-directory store keeps one probe's entries on disk, not
the search's: on the H200 the seed's split at REQUESTS=16 passed the store-room check, and its
capacity search then filled the 64 GiB disk and stopped prefill ("No space left on device").
A load sweep keeps one level's, and its link row still counts every level's bytes: at the labs'
REQUESTS=24 the room check asked for 68.8 GB of a 67.5 GB disk."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvlab import loadgen
from kvlab.core.settings import Settings
from kvlab.engines.vllm import store as kvstore
from kvlab.experiments import disagg, offload
from kvlab.loadgen import linkrun
from kvlab.loadgen.capacity import CapacityAsk, SearchPlan
from kvlab.loadgen.spec import LoadSpec
from kvlab.records.load import RunContext
from kvlab.records.models import LoadRecord


def entry(store: Path, name: str) -> Path:
    path = store / name
    path.mkdir(parents=True)
    (path / "model.layers.0.self_attn.attn.safetensors").write_bytes(b"\0" * 64)
    return path


def test_only_the_stores_entries_are_removed(tmp_path: Path) -> None:
    store = tmp_path / "pd"
    entries = [entry(store, f"{i:032x}") for i in range(3)]
    notes = store / "notes.txt"
    notes.write_text("mine", encoding="utf-8")
    odd = store / "not-a-hash"
    odd.mkdir()
    assert kvstore.remove_entries(store) == 3
    assert not any(e.exists() for e in entries) and notes.exists() and odd.exists()
    assert kvstore.remove_entries(tmp_path / "absent") == 0


def fake_lab(tmp_path: Path, connector: str) -> Any:
    said: list[str] = []
    return SimpleNamespace(settings=Settings(connector=connector, labbook=str(tmp_path / "b")),
                           cluster=None, say=said.append, said=said, record=lambda r: r,
                           api_key=lambda: "",
                           install=lambda engine: SimpleNamespace(platform="cuda"))


def test_each_probe_of_a_search_leaves_the_store_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "pd"
    entry(store, "a" * 32)  # the load's, before the search
    left: list[int] = []

    async def fake_search(spec: Any, target: Any, knob: Any, plan: Any, *, api_key: str,
                          on_row: Any, say: Any, measured: Any = ()) -> Any:
        for probe in range(3):  # each probe writes two entries, then its row is recorded
            entry(store, f"{probe}b".ljust(32, "0"))
            entry(store, f"{probe}c".ljust(32, "0"))
            on_row(LoadRecord(label="disagg", lab="pd", concurrency=1, requests=2))
            left.append(sum(1 for p in store.iterdir() if kvstore.is_entry(p)))
        return SimpleNamespace(record=SimpleNamespace(statement="the search's answer"))

    monkeypatch.setattr(loadgen, "search", fake_search)  # offload asks the package for it
    lab = fake_lab(tmp_path, "shared")
    after = disagg._between_probes(lab, str(store))
    assert after is not None and not any(store.iterdir())
    ask = CapacityAsk("ttft_p90<=0.5", SearchPlan(start=1.0, max_steps=3, duration_s=1.0))
    load = LoadSpec(base_url="http://127.0.0.1:1/v1", model="m", levels=(1,), requests=4,
                    max_tokens=8, prompt_set="mixed", label="disagg")
    asyncio.run(offload.measure_capacity(lab, ask, load, "rate", after))
    assert left == [0, 0, 0]
    assert "1 entries of the load removed before the capacity search" in lab.said[0]


def test_a_point_to_point_split_or_no_store_removes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "pd"
    entry(store, "d" * 32)
    assert disagg._between_probes(fake_lab(tmp_path, "nixl"), str(store)) is None
    assert disagg._between_probes(fake_lab(tmp_path, "shared"), "") is None
    assert any(store.iterdir())


def held(store: Path) -> int:
    return sum(1 for p in store.iterdir() if kvstore.is_entry(p))


def sweep_writing(store: Path, per_level: int, left: list[int]) -> Any:
    """A sweep of two levels through the store: each level's requests write their entries,
    then its row is written."""
    async def fake_sweep(load: Any, *, api_key: str, stop: Any, progress: Any,
                         on_row: Any) -> Any:
        rows = []
        for level in range(2):
            for i in range(per_level):
                entry(store, f"{level}{i}".ljust(32, "e"))
            row = LoadRecord(label="disagg", lab="pd", concurrency=level + 1,
                             requests=per_level)
            on_row(row)
            rows.append(row)
            left.append(held(store))
        return linkrun.SweepResult(rows=rows)
    return fake_sweep


def run_split_load(store: Path, drain: bool, monkeypatch: pytest.MonkeyPatch,
                   left: list[int]) -> Any:
    monkeypatch.setattr(linkrun, "run_sweep", sweep_writing(store, 3, left))
    load = LoadSpec(base_url="http://127.0.0.1:1/v1", model="m", levels=(1, 2), requests=3,
                    max_tokens=8, prompt_set="mixed", label="disagg",
                    context=RunContext(engines=[]))
    spec = linkrun.LinkSpec(connector="shared", context_length=2048, iface="",
                            store_path=str(store), drain_store=drain)
    written: list[Any] = []
    link, _ = asyncio.run(linkrun.run_load(load, spec, str(store.parent / "book.md"),
                                           written.append))
    return link


def test_a_split_load_holds_one_levels_entries_and_counts_every_levels_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "pd"
    entry(store, "f" * 32)  # the proxy check's, before the load
    left: list[int] = []
    link = run_split_load(store, True, monkeypatch, left)
    assert left == [0, 0]
    assert link.store_bytes == 6 * 64  # both levels' entries, not the one left on disk


def test_without_draining_the_store_keeps_the_sweeps_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "pd"
    entry(store, "f" * 32)
    left: list[int] = []
    link = run_split_load(store, False, monkeypatch, left)
    assert left == [4, 7] and link.store_bytes == 6 * 64


def test_the_room_check_counts_the_largest_level_or_a_load_test_files_whole_sweep(
        tmp_path: Path) -> None:
    spec = disagg.DisaggSpec(levels=(1, 4), requests=10, repeat=2)
    ours = SimpleNamespace(settings=Settings(labbook=str(tmp_path / "b")), cluster=None,
                           run_id=None, placement=None)
    theirs = SimpleNamespace(settings=Settings(labbook=str(tmp_path / "b"),
                                               load_test=str(tmp_path / "lt.py")),
                             cluster=None, run_id=None, placement=None)
    largest = disagg.store_writes(ours, spec)  # type: ignore[arg-type]
    whole = disagg.store_writes(theirs, spec)  # type: ignore[arg-type]
    assert 10 <= largest < whole and whole > 2 * 2 * 10
