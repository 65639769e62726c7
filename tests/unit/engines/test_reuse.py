"""Which engines a pass keeps for its next step (`engines/reuse.py`): the same plan but its
port, a reset that reaches every cache the engine has, and a start slower than a checked
reset; the reset route served (vLLM's dev mode) only on loopback."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvlab.engines.plan import EnginePlan, Flag
from kvlab.engines.process import EngineProcess
from kvlab.engines.reuse import EnginePool, key, poolable, resettable


def _vllm(port: int, *flags: Flag, host: str = "127.0.0.1") -> EnginePlan:
    return EnginePlan(engine="vllm", role="baseline", command=("vllm", "serve"),
                      flags=(Flag("--host", host), Flag("--port", str(port)), *flags),
                      env={"VLLM_NO_USAGE_STATS": "1"}, host=host, port=port)


def _llama(port: int, cache_ram: str) -> EnginePlan:
    return EnginePlan(engine="llama.cpp", role="llama", command=("llama-server",),
                      flags=(Flag("--port", str(port)), Flag("--cache-ram", cache_ram)),
                      port=port)


def test_two_plans_are_one_engine_when_only_their_ports_differ() -> None:
    assert key(_vllm(8000)) == key(_vllm(9000))
    assert key(_vllm(8000)) != key(_vllm(8000, Flag("--gpu-memory-utilization", "0.4")))
    assert key(_vllm(8000)) != key(replace(_vllm(8000), env={"VLLM_CPU_KVCACHE_SPACE": "2"}))


def test_only_engines_whose_whole_cache_the_reset_empties_are_kept() -> None:
    assert resettable(_vllm(1)) and resettable(_llama(1, "0"))
    assert not resettable(_llama(1, "64"))  # the RAM cache outlives a slot erase
    assert not resettable(_vllm(1, Flag("--kv-transfer-config", "{}")))
    assert not resettable(_vllm(1, Flag("--kv-offloading-size", "8")))


def test_the_reset_route_is_served_on_loopback_only() -> None:
    assert poolable(_vllm(1)).env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in poolable(_vllm(1, host="0.0.0.0")).env  # noqa: S104
    assert poolable(_llama(1, "0")) == _llama(1, "0")


def test_a_start_quicker_than_a_checked_reset_is_not_kept(tmp_path: Path) -> None:
    pool = EnginePool()
    quick, slow = EngineProcess(_vllm(1), tmp_path / "a"), EngineProcess(_vllm(2), tmp_path / "b")
    quick.ready_s, slow.ready_s = 0.5, 40.0
    assert not pool.keep(quick, "quick") and pool.keep(slow, "slow")
    assert [k.label for k in pool.idle] == ["slow"]
