"""The registry: every engine by its name and aliases, a role's engine, a plan that refuses
what its engine cannot honour, the store a connector keeps; and the adapters' answers where an
engine has nothing to say (mlx-lm: no /metrics, no /tokenize, no reset)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.core import EngineError, RefusedError, SettingError, Settings
from kvlab.engines import (
    HOST_TIER,
    LLAMA_CPP,
    MLX_LM,
    NAMES,
    VLLM,
    PlanRequest,
    canonical_name,
    engine_for,
    install_of,
    make_plan,
    refuse_missing_model,
    store_for,
)
from kvlab.engines.registry import engine_of_role
from kvlab.engines.roles import ENGINE_ROLES, TITLES


def test_every_engine_is_listed_once_with_its_roles_and_titles() -> None:
    assert NAMES == (VLLM, LLAMA_CPP, MLX_LM)
    assert canonical_name("llamacpp") == LLAMA_CPP and canonical_name("vllm") == VLLM
    assert engine_of_role("decode").name == VLLM and engine_of_role("mlx").name == MLX_LM
    assert set(TITLES) == set(ENGINE_ROLES)
    with pytest.raises(RefusedError, match="no engine plays the role 'router'"):
        engine_of_role("router")


def test_a_plan_field_the_engine_does_not_honour_is_refused(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    settings = Settings(llama_model=str(gguf))
    with pytest.raises(RefusedError, match=r"llama\.cpp has no equivalent of cpu_core"):
        make_plan(settings, LLAMA_CPP, "llama", request=PlanRequest(cpu_core=1))
    with pytest.raises(RefusedError, match="vllm has no equivalent of kv_cache_type"):
        make_plan(settings, VLLM, "baseline", request=PlanRequest(kv_cache_type="q8_0"))
    with pytest.raises(RefusedError, match="plays no role 'llama'"):
        make_plan(settings, VLLM, "llama")
    plan = make_plan(settings, LLAMA_CPP, "llama",
                     request=PlanRequest(slots=3, host_cache_mib=0, log_cache_state=True))
    assert plan.flag_value("--parallel") == "3" and plan.flag_value("--cache-ram") == "0"
    assert plan.flag_value("--log-verbosity") is not None


def test_only_the_shared_directory_keeps_a_store() -> None:
    assert store_for("shared") is not None
    assert store_for("nixl") is None and store_for("none") is None and store_for(None) is None
    assert store_for("fs") is None  # its block files are no ExampleConnector entries


def test_mlx_lm_answers_nothing_it_does_not_have(tmp_path: Path) -> None:
    mlx = engine_for(MLX_LM)
    install = install_of(Settings(kvlab_home=str(tmp_path)), MLX_LM)  # nothing installed
    assert not install.found and "kvlab engines install --only mlx" in install.reason
    with pytest.raises(EngineError, match="mlx-lm is not installed"):
        install.require()
    assert not install.supports(HOST_TIER).ok
    assert install.accepted_flags(tmp_path) is None
    assert mlx.counters == {} and mlx.gauges == {} and mlx.metric_namespace == ""
    assert mlx.block_size("cpu") == 1 and mlx.missing(Settings()) is None
    plan = make_plan(Settings(model=str(tmp_path), kvlab_home=str(tmp_path)), MLX_LM, "mlx",
                     install, PlanRequest(port=8123))
    assert plan.engine == MLX_LM and plan.port == 8123 and not mlx.resettable(plan)
    assert mlx.effective_args(None, ["python", "-m", "vllm", "serve"]) is None
    found = mlx.effective_args(None, ["python", "-m", "mlx_lm", "server", "--port", "9"])
    assert found is not None and found.values == {"port": "9"}


def test_llama_server_not_found_says_the_fix(tmp_path: Path) -> None:
    install = install_of(Settings(llama_bin=str(tmp_path / "absent"),
                                  kvlab_home=str(tmp_path)), LLAMA_CPP)
    assert not install.found and "LLAMA_BIN" in install.reason
    assert install.supports(HOST_TIER).ok  # --cache-ram: its prompt cache in host RAM
    assert engine_for(LLAMA_CPP).missing(Settings(llama_model="")) is not None


def test_a_model_path_that_is_not_here_is_refused_at_the_plan(tmp_path: Path) -> None:
    # #48 finding 15: MODEL=/nonexistent/model planned `vllm serve /nonexistent/model` silently
    home = tmp_path / "home"
    for key, value in (("model", "/nonexistent/model"), ("small_model", "./no-such-dir")):
        settings = Settings(kvlab_home=str(home), **{key: value})
        plan = make_plan(settings, VLLM, "baseline", install_of(settings, VLLM),
                         PlanRequest(model=value))
        with pytest.raises(SettingError) as err:
            refuse_missing_model(settings, plan)
        assert str(err.value).startswith(f"{key.upper()}={value}: no such file or directory")
    for value in ("Qwen/Qwen3-8B", str(tmp_path), str(home / "models" / "tiny" / "hf")):
        settings = Settings(kvlab_home=str(home), model=value)  # a Hub id, a directory here,
        refuse_missing_model(settings, make_plan(  # kvlab's own (made before a start)
            settings, VLLM, "baseline", install_of(settings, VLLM)))
