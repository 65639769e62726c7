"""Golden argv and environment for every vLLM role, and the seed scripts' refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.core.errors import RefusedError
from kvlab.core.settings import Settings
from kvlab.engines import vllm

GPU = vllm.VllmInstall(("vllm",), "cuda", "PATH")
CPU = vllm.VllmInstall(("/venv/bin/python", "/kvlab/shims/vllm_cpu_cli.py"), "cpu", "kvlab venv")
COMMON = ["--served-model-name", "local-chat", "--max-model-len", "8192", "--max-num-seqs", "8"]


def settings(**values: object) -> Settings:
    return Settings(**values)  # type: ignore[arg-type]


def argv(role: str, install: vllm.VllmInstall = GPU, flags: frozenset[str] | None = None,
         **values: object) -> list[str]:
    return vllm.plan(settings(**values), role, install, flags=flags).argv()


def test_baseline_is_serve_decode_monolithic() -> None:
    assert argv("baseline") == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8200", *COMMON,
        "--gpu-memory-utilization", "0.85", "--enable-prompt-tokens-details",
    ]


def test_offload_on_uses_the_serve_flags() -> None:
    assert argv("offload", flags=frozenset({"--kv-offloading-size"}))[-5:] == [
        "--enable-prefix-caching", "--kv-offloading-backend", "native", "--kv-offloading-size",
        "8",
    ]


def test_offload_on_falls_back_to_the_connector_json() -> None:
    args = argv("offload", flags=frozenset({"--kv-transfer-config"}), kv_offload_gb=2)
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"cpu_bytes_to_use": 2 * 2**30}}


def test_offload_off_has_no_tier() -> None:
    plan = vllm.plan(settings(offload=False), "offload", GPU)
    assert not plan.has_flag("--kv-offloading-size") and plan.label_hint == "offload-off"
    assert plan.has_flag("--enable-prefix-caching")


def test_weight_offload_is_refused_with_the_distinction() -> None:
    opts = vllm.PlanOptions(extra_args=("--cpu-offload-gb", "10"))
    with pytest.raises(RefusedError, match="WEIGHTS"):
        vllm.plan(settings(), "offload", GPU, opts)


def test_shared_instances_use_kv_both_on_one_store(tmp_path: Path) -> None:
    store = str(tmp_path / "kv")
    a = vllm.plan(settings(kv_shared_path=store), "shared-a", GPU)
    b = vllm.plan(settings(kv_shared_path=store), "shared-b", GPU)
    assert (a.port, b.port) == (8100, 8200)
    for plan in (a, b):
        config = json.loads(plan.flag_value("--kv-transfer-config") or "")
        assert config == {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                          "kv_connector_extra_config": {"shared_storage_path": store}}
        assert plan.private_dirs == (store,)
        assert plan.flag_value("--max-num-batched-tokens") == "8192"  # no chunked prefill


def test_shared_without_a_store_is_refused() -> None:
    with pytest.raises(RefusedError, match="KV_SHARED_PATH is not set"):
        vllm.plan(settings(), "shared-a", GPU)


def test_prefill_and_decode_shared(tmp_path: Path) -> None:
    store = tmp_path / "kv"
    p = vllm.plan(settings(kv_shared_path=str(store)), "prefill", GPU)
    assert json.loads(p.flag_value("--kv-transfer-config") or "")["kv_role"] == "kv_producer"
    with pytest.raises(RefusedError, match="not a directory"):
        vllm.plan(settings(kv_shared_path=str(store)), "decode", GPU)
    store.mkdir()
    d = vllm.plan(settings(kv_shared_path=str(store)), "decode", GPU)
    assert json.loads(d.flag_value("--kv-transfer-config") or "")["kv_role"] == "kv_consumer"
    assert d.private_dirs == ()  # decode only reads the store


def test_nixl_needs_the_side_channel_address() -> None:
    with pytest.raises(RefusedError) as err:
        vllm.plan(settings(connector="nixl"), "prefill", GPU)
    assert "SIDE_CHANNEL_ADDR" in str(err.value)


def test_nixl_environment_per_role() -> None:
    s = settings(connector="nixl", side_channel_addr="10.0.0.2", cluster_iface="enp1s0")
    p = vllm.plan(s, "prefill", GPU)
    d = vllm.plan(s, "decode", GPU)
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"
    assert (p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], d.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == (
        "5600", "5601")
    assert p.env["UCX_NET_DEVICES"] == "enp1s0"
    assert json.loads(p.flag_value("--kv-transfer-config") or "") == {
        "kv_connector": "NixlConnector", "kv_role": "kv_producer"}


def test_mooncake_and_lmcache() -> None:
    s = settings(connector="mooncake", side_channel_addr="10.0.0.2")
    p = vllm.plan(s, "prefill", GPU)
    assert p.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998"
    assert json.loads(p.flag_value("--kv-transfer-config") or "")["kv_connector"] == (
        "MooncakeConnector")
    with pytest.raises(RefusedError, match="SIDE_CHANNEL_ADDR"):
        vllm.plan(settings(connector="mooncake"), "decode", GPU)
    lm = vllm.plan(settings(connector="lmcache"), "decode", GPU)
    assert json.loads(lm.flag_value("--kv-transfer-config") or "") == {
        "kv_connector": "LMCacheConnectorV1", "kv_role": "kv_consumer"}


def test_single_machine_uses_the_small_model_and_split_fraction(tmp_path: Path) -> None:
    s = settings(single_machine=True, kv_shared_path=str(tmp_path))
    plan = vllm.plan(s, "prefill", GPU)
    assert plan.model == "Qwen/Qwen3-1.7B"
    assert plan.flag_value("--gpu-memory-utilization") == "0.4"
    assert any("loopback" in n for n in plan.notes)
    assert vllm.plan(s, "baseline", GPU).model == "Qwen/Qwen3-1.7B"  # as serve-decode.sh
    assert vllm.plan(s, "offload", GPU).model == "Qwen/Qwen3-8B"  # serve-offload.sh ignores it


def test_cpu_platform_environment() -> None:
    plan = vllm.plan(settings(enforce_eager=True), "baseline", CPU,
                     vllm.PlanOptions(cpu_core=1))
    assert plan.argv()[:3] == ["/venv/bin/python", "/kvlab/shims/vllm_cpu_cli.py", "serve"]
    assert plan.env["VLLM_TARGET_DEVICE"] == "cpu"
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert plan.has_flag("--enforce-eager") and plan.flag_value("--dtype") == "bfloat16"


def test_fixed_kv_bytes_replaces_the_cpu_space_variable() -> None:
    plan = vllm.plan(settings(kv_cache_bytes=268_435_456), "baseline", CPU)
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env
    assert plan.flag_value("--kv-cache-memory-bytes") == "268435456"


def test_config_only_model_directory_gets_dummy_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    plan = vllm.plan(settings(model=str(tmp_path)), "baseline", GPU)
    assert plan.flag_value("--load-format") == "dummy"
    assert plan.env["HF_HUB_OFFLINE"] == "1"


def test_extra_args_pass_unchanged() -> None:
    plan = vllm.plan(settings(), "baseline", GPU, vllm.PlanOptions(extra_args=("--seed", "3")))
    assert plan.argv()[-2:] == ["--seed", "3"]


def test_unknown_role() -> None:
    with pytest.raises(RefusedError, match="unknown vLLM role"):
        vllm.plan(settings(), "router", GPU)
