"""llama.cpp's tiers experiment, pure parts: the server's log read back (KV size, the RAM
cache's saves, loads and state), the sizes the runs are given, the pressure judgement from a
host tier's own count, and the report's quantised-cache row."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.core.errors import SettingError
from kvlab.core.settings import Settings
from kvlab.engines import llamacpp
from kvlab.engines.base import InstanceFacts
from kvlab.engines.llamacpp import ramcache
from kvlab.engines.llamacpp.adapter import LLAMA_CPP_ENGINE, argv_facts
from kvlab.experiments.llama_tiers import LlamaTiersSpec, SlotPressure, candidate_ctx
from kvlab.measure.pressure import judge_pressure as judge
from kvlab.records.comparison import KvQuantRecord, KvTypeSide, RatioInterval
from kvlab.records.load import LoadRecord
from kvlab.records.notebook import Notebook
from kvlab.records.pressure import HostTierUse, Pressure, PressureReached
from kvlab.report.llama import quant_line

# lines as this build of llama-server writes them at --log-verbosity 4
STARTUP = """\
0.00.036.379 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'false'
0.00.031.338 I llama_kv_cache: size =    8.50 MiB (  4096 cells,   4 layers,  2/2 seqs), K (q8_0):    4.25 MiB, V (q8_0):    4.25 MiB
"""  # noqa: E501
RAM_LOG = """\
0.05.124.294 I srv        update:  - cache state: 0 prompts, 0.000 MiB (limits: 64.000 MiB, 4096 tokens, 67108864 est)
0.05.229.255 I srv   prompt_save:  - saving prompt with length 1212, total state size = 2.381 MiB (draft: 0.000 MiB)
0.05.232.894 I srv        update:  - cache state: 1 prompts, 2.381 MiB (limits: 64.000 MiB, 4096 tokens, 32575 est)
0.05.420.641 I srv   prompt_save:  - saving prompt with length 1811, total state size = 3.558 MiB (draft: 0.000 MiB)
0.05.422.433 I srv          load:  - found better prompt with f_keep = 0.998, f_sim = 1.000
0.05.423.048 I srv        update:  - cache state: 1 prompts, 3.558 MiB (limits: 64.000 MiB, 4096 tokens, 32576 est)
"""  # noqa: E501


def test_capacity_counts_cells_in_every_stream(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    plan = llamacpp.plan(Settings(llama_model=str(model)), "llama-server")
    found = LLAMA_CPP_ENGINE.capacity(plan, STARTUP)
    assert found.slots == 2 and found.tokens_per_slot == 4096
    assert found.kv_cache_tokens == 8192  # 4096 cells per stream, one stream per slot
    assert found.kv_cache_bytes == round(8.5 * 2**20)
    unified = STARTUP.replace("4096 cells,   4 layers,  2/2", "8192 cells,   4 layers,  2/1")
    assert LLAMA_CPP_ENGINE.capacity(plan, unified).kv_cache_tokens == 8192


def test_ram_cache_use_is_read_from_the_log() -> None:
    used = ramcache.use_in(RAM_LOG)
    assert used is not None
    assert used.stores == 2 and used.loads == 1 and used.peak_entries == 1
    assert used.limit_bytes == 64 * 2**20 and used.peak_bytes == round(3.558 * 2**20)
    assert ramcache.use_in("no cache lines here") is None


def test_plan_flags_for_the_varied_options(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    plan = llamacpp.plan(Settings(llama_model=str(model)), "llama-server", llamacpp.LlamaOptions(
        cache_prompt=False, log_verbosity=llamacpp.DEBUG_VERBOSITY, cache_type="f16"))
    argv = plan.argv()
    assert "--no-cache-prompt" in argv and "--cache-prompt" not in argv
    assert argv[argv.index("--log-verbosity") + 1] == "4"
    assert argv[argv.index("--cache-type-k") + 1] == "f16"


def test_prompt_caching_off_is_read_from_the_argv() -> None:
    facts = InstanceFacts(url="http://127.0.0.1:1/v1")
    argv_facts(["llama-server", "--no-cache-prompt"], facts)
    assert facts.prefix_caching is False
    facts = InstanceFacts(url="http://127.0.0.1:1/v1")
    argv_facts(["llama-server", "--cache-prompt"], facts)
    assert facts.prefix_caching is not False


def test_q8_0_gets_the_context_that_fits_the_f16_cache() -> None:
    # 8 MiB for 4,096 f16 cells: q8_0 keeps 32 values in 34 bytes
    assert candidate_ctx(8 * 2**20, 4096, "q8_0") == 7680
    assert candidate_ctx(8 * 2**20, 4096, "f16") == 4096


def _sizing() -> SlotPressure:
    return SlotPressure(users=6, slots=2, preamble_tokens=300, conversation_tokens=1000,
                        turn_tokens=(400, 600, 800, 900), bytes_per_token=2048.0,
                        kv_cache_bytes=2048 * 2048, cache_tokens=2048)


def test_ram_cache_sizes_hold_all_or_a_share_of_what_the_slots_cannot() -> None:
    sizing = _sizing()
    assert sizing.tier_tokens_needed == 4000  # (6 users - 2 slots) x 1000 tokens
    holds = sizing.tier_mib(1.0) * 2**20 / 2048
    assert holds >= sizing.working_set_tokens
    small = sizing.tier_mib(1 / 3) * 2**20 / 2048
    assert small < sizing.tier_tokens_needed
    planned = sizing.planned(sizing.tier_mib(1 / 3))
    assert planned.host_tier_bytes == sizing.tier_mib(1 / 3) * 2**20
    assert planned.reusable_fraction == round(1800 / 2700, 3)
    assert planned.turns and planned.requests == 6 * planned.turns


@pytest.mark.parametrize(("values", "named"), [
    ({"parts": ("turns", "disk")}, "--part"), ({"users": 3}, "--users"),
    ({"small_share": 1.0}, "share"), ({"quant_prompt_tokens": 4090}, "--quant-prompt-tokens")])
def test_spec_refuses_what_cannot_run(values: dict[str, object], named: str) -> None:
    with pytest.raises(SettingError, match=named):
        LlamaTiersSpec(**values).check()  # type: ignore[arg-type]


def _load_row(stores: int) -> LoadRecord:
    planned = _sizing().planned(8)
    return LoadRecord(
        label="llama-ram-on-load", lab="offload", model="m", concurrency=6, requests=24,
        prompt_set="sessions",
        max_tokens=16, prefix_hit_rate=0.66,
        pressure=Pressure(state="under pressure", planned=planned, reached=PressureReached(
            prefix_hit_rate=0.66, host_tier=HostTierUse(source="log", stores=stores))))


def test_a_host_tier_that_took_prompts_from_the_slots_is_pressure() -> None:
    # the hit rate is the reusable share (the tier gave everything back): without the tier's
    # own count the run would read as quiet
    assert judge([], _load_row(0)).state is False
    found = judge([], _load_row(12))
    assert found.state is True and "12 prompts left the device cache" in found.why


def _side(kv: str, tokens: int, told: str) -> KvTypeSide:
    return KvTypeSide(kv_type=kv, label=f"llama-kv-{kv}", ctx=tokens, kv_cache_bytes=2**23,
                      kv_cache_tokens=tokens, ttft_p50_s=0.3, long_prompt=told)


def test_quant_row_says_tokens_ttft_and_logprob_distance() -> None:
    record = KvQuantRecord(
        label="llama-kv-quant", lab="offload", engine="llama.cpp", model="m",
        memory_bytes=2**23, reference=_side("f16", 4096, "refused: HTTP 400"),
        candidate=_side("q8_0", 7680, "served"), tokens_ratio=1.875,
        ttft_p50=RatioInterval(ratio=2.7, low=1.3, high=5.6, words="slower"),
        logprob_gap=0.003, top_token_same=True, verdict="more tokens in the same memory")
    line = quant_line(Notebook(path=Path("book.md"), records=[record]))
    assert line.cells[3].startswith("2.70x [1.30, 5.60]")
    assert any("1.875x the tokens" in e for e in line.evidence)
    assert any("f16 refused" in e and "q8_0 served" in e for e in line.evidence)
    assert line.verdict == "more tokens in the same memory"
    empty = quant_line(Notebook(path=Path("book.md"), records=[]))
    assert empty.absent and empty.command == "kvlab run llama-tiers --part quant"
