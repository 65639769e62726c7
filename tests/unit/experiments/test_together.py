"""The memory planner of engines that share one device (`experiments/together.py`), driven with
an H200's figures: its 143,771 MiB from a fake `nvidia-smi` on PATH (never a real GPU), the
Qwen3-8B and Qwen3-1.7B shapes of `engines/models.py` (config-only directories, as `kvlab
models shaped` makes them), compiled and eager, the settings' defaults (MEM_FRACTION 0.85,
SPLIT_MEM_FRACTION 0.4, CTX 8192, MAX_SEQS 8). Every lab that starts more than one vLLM on the
device is asked for its plan as it asks (offload, the split with its baseline, shared,
replicas, the tier sizes), and each engine must get the KV cache it needs within a share that
holds it; then the retry decision on vLLM's own failure lines."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvlab.core.errors import RefusedError
from kvlab.core.hardware import device_memory_bytes
from kvlab.core.settings import Settings
from kvlab.engines import VLLM, engine_for
from kvlab.engines.models import KNOWN_SHAPES, write_shaped_config
from kvlab.engines.vllm import VllmInstall
from kvlab.experiments import offload, replicas, shared, split, tier_sizes, together
from kvlab.experiments.lab import Lab
from kvlab.experiments.sizes import AllSpec
from kvlab.measure import kvmath
from kvlab.records import PRESSURE_OFF, PRESSURE_ON, QUIET_OFF, QUIET_ON

GIB = 2**30
H200_MIB = 143771  # nvidia-smi --query-gpu=memory.total, MiB, as the H200 reported it
# vLLM 0.26's own line from the H200 (issue 45), and the same check as newer vLLMs word it
SHARED_PAIR_DIED = (
    "(EngineCore_DP0 pid=2281) ValueError: To serve at least one request with the model's max "
    "seq len (8192), 0.88 GiB KV cache is needed, which is larger than the available KV cache "
    "memory (0.8 GiB). Based on the available memory, the estimated maximum model length is "
    "7488. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
    "initializing the engine.")
NEWER_WORDING = ("ValueError: To serve at least one request with the models's max seq len "
                 "(131072), (16.00 GiB KV cache is needed, which is larger than the available "
                 "KV cache memory (0.71 GiB).")
LABS = AllSpec.lab((1, 4, 8), None, 128, 4096, 1500, "shared-prefix", gpu=True)
QUICK = AllSpec.quick("shared-prefix", gpu=True)


def fake_smi(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nprintf "{answer}"\n', encoding="utf-8")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shaped models' directory, on a machine whose nvidia-smi says an H200."""
    fake_smi(tmp_path / "bin", monkeypatch, f"{H200_MIB}\\n")
    for name in ("qwen3-8b", "qwen3-1.7b"):
        write_shaped_config(tmp_path / name, name)
    return tmp_path


def gpu_lab(models: Path, *, eager: bool = False, **values: Any) -> Lab:
    """A lab on the GPU machine as a new user runs it: MODEL and SMALL_MODEL the shapes, a
    CUDA vLLM on PATH (never run)."""
    shapes = {"model": str(models / "qwen3-8b"), "small_model": str(models / "qwen3-1.7b")}
    settings = Settings(**{**shapes, "enforce_eager": eager, **values})
    lab = Lab(settings)
    lab.installs[VLLM] = VllmInstall(("vllm",), "cuda", "PATH")
    return lab


def request_bytes(model: Path, tokens: int) -> float:
    return kvmath.shape_from_hf_config(model).bytes_per_token() * tokens


def check_guaranteed(memory: together.MemoryPlan, lab: Lab, quiet: set[str]) -> None:
    """Each engine planned a cache of at least one request of CTX tokens (MAX_SEQS of them
    where the lab needs it quiet), within its share; all of them within the device."""
    s = lab.settings
    assert memory.start == "together", memory.why
    assert memory.planned and memory.device is not None
    usable = memory.device.total - engine_for(VLLM).device_rules(s).reserve_bytes  # type: ignore[union-attr]
    for placed in memory.placed:
        per_request = request_bytes(Path(placed.want.model), s.ctx)
        least = per_request * (s.max_seqs if placed.want.label in quiet else 1)
        assert placed.want.cache_bytes >= least, placed.want.label
        assert placed.need <= memory.fraction * usable, placed.want.label
        assert placed.weights > 0 and placed.activations > 0
    assert sum(p.held for p in memory.placed) <= usable
    facts = memory.facts(memory.placed[0].want.label)
    assert facts is not None and facts["cache_bytes"] == memory.placed[0].want.cache_bytes


def test_the_device_memory_is_nvidia_smis_and_unknown_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path / "bin", monkeypatch, f"{H200_MIB}\\n")
    assert device_memory_bytes() == H200_MIB * 2**20
    fake_smi(tmp_path / "spark", monkeypatch, "[N/A]\\n")
    assert device_memory_bytes() is None


def test_the_shapes_weights_and_activations_are_their_configs(h200: Path) -> None:
    for name, gib in (("qwen3-8b", 13.0), ("qwen3-1.7b", 2.66)):
        shape = KNOWN_SHAPES[name]
        model = h200 / name
        weights = kvmath.weight_bytes(model)
        assert weights is not None and abs(weights / GIB - gib) < 0.01  # vLLM said 13.01 (8B)
        per_token = kvmath.activation_bytes_per_token(model)
        q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        assert per_token == 2 * (3 * shape.intermediate + 2 * q + 2 * kv + 2 * shape.hidden)
    # the 8B shape's peak at 65,536 batched tokens: 6.75 GiB, above the 6.53 vLLM measured
    assert kvmath.activation_bytes_per_token(h200 / "qwen3-8b") * 65536 / GIB == 6.75  # type: ignore[operator]
    assert kvmath.activation_bytes_per_token(h200 / "Qwen" / "Qwen3-8B") is None  # a Hub id


@pytest.mark.parametrize("eager", [False, True], ids=["compiled", "eager"])
@pytest.mark.parametrize("sizes", [LABS, QUICK], ids=["labs-sizes", "quick"])
def test_every_labs_engines_fit_an_h200_with_the_cache_they_need(
        h200: Path, eager: bool, sizes: AllSpec) -> None:
    lab = gpu_lab(h200, eager=eager)
    spec = replace(offload.all_spec(lab, sizes), block_size=16)
    pressure = offload.pressure_plan(lab, spec)
    four = offload.together_memory(lab, spec, pressure, (False, True))
    check_guaranteed(four, lab, {QUIET_OFF.label, QUIET_ON.label})
    assert four.fraction == 0.212 and len(four.placed) == 4
    assert four.cache(PRESSURE_OFF.label) == four.cache(PRESSURE_ON.label) \
        == pressure.kv_cache_bytes  # the tier is the one thing the pair differs in
    for memory in (split.split_memory(lab, at_once=True), split.split_memory(lab, False)):
        check_guaranteed(memory, lab, {"prefill", "decode", "baseline"})
        assert len({p.want.cache_bytes for p in memory.placed}) == 1
    pair = shared.pair_memory(lab)
    assert pair is not None and pair.fraction == 0.4
    check_guaranteed(pair, lab, {"shared-store-a", "shared-store-b"})
    labels = [f"replicas-replica-{i}" for i in range(3)]
    three = replicas.replica_memory(lab, labels)
    assert three is not None
    check_guaranteed(three, lab, set(labels))


def test_the_shared_pair_that_died_on_the_h200_now_has_its_planned_caches(h200: Path) -> None:
    """Issue 45: the two 1.7B engines at 0.4 each, compiled, profiling at once: one was left
    0.8 GiB where one request of 8,192 tokens needs 0.88. Planned, each gets 7 GiB (eight
    such requests) and skips the profile."""
    lab = gpu_lab(h200)
    memory = shared.pair_memory(lab)
    assert memory is not None
    assert request_bytes(h200 / "qwen3-1.7b", 8192) / GIB == 0.875
    assert {p.want.cache_bytes for p in memory.placed} == {7 * GIB}
    plans = shared.pair_plans(lab, str(h200 / "store"), memory)
    for plan in plans:
        assert plan.flag_value("--kv-cache-memory-bytes") == str(7 * GIB)
        assert plan.flag_value("--gpu-memory-utilization") == "0.4"
        assert plan.startup_facts.device_plan is not None
        assert plan.startup_facts.device_plan.start == "together"


def test_the_tier_sizes_fit_on_the_small_shape_and_are_refused_on_the_large(
        h200: Path) -> None:
    """`h200.sh tier-sizes` starts five engines (tier off and four sizes) on the 1.7B
    shape; five 8B engines do not fit, and are refused before anything starts."""
    lab = gpu_lab(h200, model=str(h200 / "qwen3-1.7b"))
    spec = replace(offload.OffloadSpec(concurrency=8, preamble_tokens=4096), block_size=16)
    pressure = offload.pressure_plan(lab, spec)
    kept = [tier_sizes.Engine(gb, pressure.kv_cache_bytes) for gb in (0.0, 2, 4, 8, 12)]
    memory = tier_sizes.device_memory(lab, kept)
    assert memory is not None and memory.fraction == 0.17
    check_guaranteed(memory, lab, set())
    big = gpu_lab(h200)
    with pytest.raises(RefusedError, match="give fewer --tier-sizes") as refused:
        tier_sizes.device_memory(big, [tier_sizes.Engine(0.0, 8 * GIB)] * 5)
    assert "engine-0 needs 28." in str(refused.value)


def test_engines_that_cannot_share_the_device_at_once_start_one_at_a_time(
        h200: Path) -> None:
    """Six 8B engines of 9 GiB each do not fit at once (a share of 0.142 is 19.7 GiB); where
    the lab can run each by itself, each gets MEM_FRACTION alone."""
    lab = gpu_lab(h200)
    wants = [together.Want(f"e{i}", lab.settings.model, 9 * GIB) for i in range(6)]
    alone = together.memory_plan(lab, wants, alone=True)
    assert alone.start == "apart" and alone.fraction == 0.85
    assert "e0 needs 29.2 GiB" in alone.why and "alone each fits MEM_FRACTION 0.85" in alone.why
    assert together.memory_plan(lab, wants).start is None


def test_a_size_not_known_here_leaves_each_engine_its_own_profile_one_after_the_other(
        h200: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = gpu_lab(h200, small_model="Qwen/Qwen3-1.7B")
    memory = split.split_memory(lab, at_once=False)
    assert memory.start == "in turn" and not memory.planned
    assert "Qwen/Qwen3-1.7B's weights is not known here" in memory.why
    assert split.split_settings(lab, "/store", memory).kv_cache_bytes == 0
    remote = gpu_lab(h200)
    remote.placement = SimpleNamespace(remote=True)  # type: ignore[assignment]
    assert together.memory_plan(remote, [together.Want("a", "m", GIB)]).why == \
        "they are placed on Ray nodes"
    monkeypatch.setenv("PATH", str(h200 / "no-smi"))
    unknown = together.memory_plan(gpu_lab(h200), [together.Want("a", "m", GIB)])
    assert unknown.start == "in turn" and "nvidia-smi did not say" in unknown.why


def test_a_together_start_that_died_for_memory_is_retried_once_one_at_a_time(
        h200: Path) -> None:
    vllm = engine_for(VLLM)
    lab = gpu_lab(h200)
    pair = shared.pair_memory(lab)
    assert pair is not None
    for log in (SHARED_PAIR_DIED, NEWER_WORDING,
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                "RuntimeError: CUDA error: out of memory",
                "ValueError: Free memory on device cuda:0 (19.77/22.05 GiB) on startup is less "
                "than desired GPU memory utilization (0.9, 19.84 GiB)."):
        failure = vllm.memory_failure(f"INFO loading\n{log}\nRuntimeError: Engine core "
                                      "initialization failed. See root cause above.")
        assert failure is not None and failure in log
        retry = together.retry_plan(pair, failure)
        assert retry is not None and retry.start == "in turn"
        assert retry.retried_after == failure
        plan = together.stamped(shared.pair_plans(lab, str(h200 / "s"), pair)[0], retry,
                                "shared-store-a")
        facts = plan.startup_facts.device_plan  # what its startup line records
        assert facts is not None and facts.start == "one at a time"
        assert facts.retried_after == failure and facts.cache_bytes == 7 * GIB
    assert vllm.memory_failure(SHARED_PAIR_DIED) == SHARED_PAIR_DIED[SHARED_PAIR_DIED.index(
        "To serve"):][:300]
    # no retry: a failure that is not for memory, or engines already started one at a time
    assert vllm.memory_failure("INFO Free memory on device (139.29/139.8 GiB) on startup. "
                               "Desired GPU memory utilization is (0.85, 118.83 GiB).") is None
    assert together.retry_plan(pair, None) is None
    assert together.retry_plan(replace(pair, start="in turn"), "CUDA out of memory") is None
    assert engine_for("llama.cpp").memory_failure(SHARED_PAIR_DIED) is None
