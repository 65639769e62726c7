"""`kvlab run llama-tiers` on real llama-servers with the tiny GGUF: llama.cpp's path through
the offload lab's tasks 2 and 3 and its quantised cache, and the report rows they fill.

One run of every part at small sizes (one module-scoped notebook); each test reads what the
engines reported into it. The RAM cache's host-tier behaviour is the engine's own: nothing
here is faked.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines.models import TinyModels
from kvlab.experiments import llama_tiers
from kvlab.experiments.lab import Lab
from kvlab.records import notebook
from kvlab.records.models import KvQuantRecord, LoadRecord, ReuseRecord, StartupRecord
from kvlab.report import build

pytestmark = pytest.mark.llama

SPEC = llama_tiers.LlamaTiersSpec(turns=3, preamble_words=400, slot_ctx=1024,
                                  quant_ctx=2048, quant_requests=8, quant_prompt_tokens=600)


@pytest.fixture(scope="module")
async def book(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels,
               llama_binary: Path) -> notebook.Notebook:
    root = tmp_path_factory.mktemp("llama-offload")
    lab = Lab(cpu_settings(llama_model=tiny_models.gguf, llama_bin=str(llama_binary),
                           labbook=str(root / "book.md"),
                           llama_slot_save_path=str(root / "slots")))
    await llama_tiers.run(lab, SPEC)
    return notebook.read(root / "book.md")


def _load(book: notebook.Notebook, label: str) -> LoadRecord:
    rows = book.of(LoadRecord, label)
    assert len(rows) == 1, label
    return rows[0]


def test_prompt_caching_off_reuses_nothing_and_on_reuses_every_later_turn(
        book: notebook.Notebook) -> None:
    off, on = book.of(ReuseRecord, "llama-prompt-off")[0], book.of(ReuseRecord,
                                                                    "llama-prompt-on")[0]
    assert [r.cached_tokens for r in off.rows[1:]] == [0, 0]
    # the instance's own argv says caching is off, and each missed turn names that cause
    assert all(reasons[0].startswith("cause: prefix caching is OFF")
               for reasons in off.turn_reasons[1:]), off.turn_reasons
    later = on.rows[1:]
    assert all(r.verdict == "reused" for r in later), [r.verdict for r in later]
    # each turn finds at least the previous turn's prompt in the slot (its answer too, when
    # the template renders it back as the tokens generated; a long answer that re-tokenizes
    # otherwise is recomputed, so a fraction of this turn's own prompt would be flaky)
    sizes = [(r.cached_tokens or 0, p.prompt_tokens or 1) for p, r in pairwise(on.rows)]
    assert all(cached >= 0.9 * before for cached, before in sizes), sizes


def test_ram_cache_brings_back_what_the_slots_lost(book: notebook.Notebook) -> None:
    off, on = _load(book, "llama-ram-off-load"), _load(book, "llama-ram-on-load")
    assert off.ok == on.ok == off.requests
    planned = on.pressure.planned if on.pressure else None
    assert planned is not None and planned.users == 6 and planned.concurrency == 2
    reusable = planned.reusable_fraction
    assert off.prefix_hit_rate is not None and off.prefix_hit_rate < 0.6 * reusable
    assert on.prefix_hit_rate is not None and on.prefix_hit_rate >= 0.85 * reusable
    assert off.sessions and on.sessions
    assert on.sessions.evicted_turns < off.sessions.evicted_turns
    reached = on.pressure.reached if on.pressure else None
    assert reached is not None and reached.host_tier is not None
    tier = reached.host_tier
    assert tier.loads > 0 and tier.stores >= tier.loads
    assert tier.limit_bytes == planned.host_tier_bytes
    assert tier.peak_bytes is not None and tier.peak_bytes <= tier.limit_bytes
    off_reached = off.pressure.reached if off.pressure else None
    assert off_reached is not None and off_reached.host_tier is None  # --cache-ram 0


def test_the_ram_cache_curve_answers_how_much_tier(book: notebook.Notebook) -> None:
    """One run per RAM cache size, none first; the report's answer reads them."""
    from kvlab.report.decisions import decide
    from kvlab.report.decisions_host import TIER_SIZE_Q

    rows = book.of(LoadRecord, "llama-ram-curve-load")
    sizes = [r.pressure.planned.host_tier_bytes if r.pressure and r.pressure.planned else None
             for r in rows]
    assert 4 <= len(rows) <= len(llama_tiers.CURVE_SHARES)  # sizes equal in whole MiB run once
    assert all(r.ok == r.requests for r in rows)
    assert sizes[0] == 0 and all(isinstance(n, int) for n in sizes)
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes), sizes
    recomputed = [r.sessions.evicted_turns for r in rows if r.sessions]
    assert recomputed[-1] < recomputed[0], recomputed  # every conversation fits the largest
    found = next(d for d in decide(book) if d.question == TIER_SIZE_Q)
    assert found.decided and found.answer.startswith("On llama.cpp's RAM cache, ")
    assert "--cache-ram" in found.answer or "no size paid" in found.answer


def test_smaller_ram_cache_is_smaller_than_what_it_must_hold(book: notebook.Notebook) -> None:
    small = _load(book, "llama-ram-small-load")
    planned = small.pressure.planned if small.pressure else None
    assert planned is not None and planned.tier_bytes_needed
    assert planned.host_tier_bytes is not None
    assert planned.host_tier_bytes < planned.tier_bytes_needed
    reached = small.pressure.reached if small.pressure else None
    assert reached is not None and reached.host_tier is not None
    assert reached.host_tier.peak_bytes is not None
    assert reached.host_tier.peak_bytes <= planned.host_tier_bytes


def test_q8_0_holds_more_tokens_in_the_f16_cache_memory(book: notebook.Notebook) -> None:
    r = book.of(KvQuantRecord, "llama-kv-quant")[0]
    assert r.reference.kv_type == "f16" and r.candidate.kv_type == "q8_0"
    assert r.memory_bytes == r.reference.kv_cache_bytes
    assert r.candidate.kv_cache_bytes is not None and r.memory_bytes is not None
    assert r.candidate.kv_cache_bytes <= r.memory_bytes
    assert r.tokens_ratio is not None and 1.8 <= r.tokens_ratio <= 1.9
    assert r.reference.long_prompt.startswith("refused") and r.candidate.long_prompt == "served"
    assert r.logprob_gap is not None and r.logprob_gap < 0.05
    assert r.ttft_p50 is not None and r.ttft_p50.requests == [8, 8]
    assert r.verdict == "more tokens in the same memory"
    starts = {s.label: s for s in book.of(StartupRecord)}
    assert {"llama-kv-f16", "llama-kv-q8_0"} <= set(starts)


def test_report_places_the_llama_rows_in_the_offload_table(book: notebook.Notebook) -> None:
    report = build(book.path)
    table = report.tables[0]
    by_name = {line.name: line for line in table.lines}
    on = by_name["llama.cpp RAM cache (host tier), slots under pressure"]
    assert not on.absent and on.verdict in ("paid", "no difference", "cost time")
    assert "TTFT p50 against no RAM cache" in on.cells[3]
    assert any("came back" in e for e in on.evidence)
    assert by_name["llama.cpp, prompt caching on"].verdict.startswith("reused")
    quant = by_name["llama.cpp quantised KV (q8_0) against f16, same memory"]
    assert "TTFT p50 q8_0 / f16" in quant.cells[3]
    assert "measured on no startup line" not in quant.measured_on


def test_decisions_read_the_llama_rows(book: notebook.Notebook) -> None:
    by_question = {d.question: d for d in build(book.path).decisions}
    host = by_question["Did the host tier pay?"]
    # no vLLM tier ran here: llama.cpp's RAM cache answers, and vLLM's absence is said
    assert host.answer.startswith("On llama.cpp the RAM prompt cache (its host tier) ")
    assert "vLLM's tier: Not enough evidence" in host.answer
    assert "llama-ram-on-load" in host.rows
    quant = by_question["What did the quantised cache buy, and what did it cost?"]
    assert quant.decided and quant.answer.startswith("q8_0 held 1.8")
