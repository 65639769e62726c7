"""llama-server is built for the device the engines run on, or not at all: CUDA with nvcc,
ROCm with hipcc, Metal on macOS, the CPU only where no GPU is in use. The machines are passed
in (hardware, environment, system); the build's steps are recorded instead of run."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from kvlab.core.hardware import Hardware
from kvlab.core.settings import Settings
from kvlab.engines import LLAMA_CPP, MLX_LM, install, llama_build, llamacpp
from kvlab.engines.prepare import prepare_engines

H200 = Hardware(True, "nvidia-smi -L lists 1 GPU(s)", "discrete", ("GPU 0: NVIDIA H200",),
                "nvidia")
NO_GPU = Hardware(False, "no GPU visible", "none")


def _tool(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_a_gpu_machine_takes_a_cuda_build_with_nvcc_from_cuda_home(tmp_path: Path) -> None:
    nvcc = _tool(tmp_path / "cuda" / "bin" / "nvcc")
    env = {"PATH": str(tmp_path / "empty"), "CUDA_HOME": str(tmp_path / "cuda")}
    found = llama_build.cuda_target(env, arch="90")
    assert found.buildable and found.device == "cuda" and found.key == "cuda-sm90"
    assert {"-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
            f"-DCMAKE_CUDA_COMPILER={nvcc}"} <= set(found.cmake_flags)
    chosen = llama_build.target(Settings(), "isa", hw=H200, env=env, system="Linux")
    assert chosen.device == "cuda"  # never the CPU's build on a GPU machine


@pytest.fixture(autouse=True)
def no_default_toolkits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's own /usr/local/cuda (a CPU box may have one) is not the test's."""
    monkeypatch.setattr(llama_build, "CUDA_ROOT", str(tmp_path / "no-cuda"))
    monkeypatch.setattr(llama_build, "ROCM_ROOT", str(tmp_path / "no-rocm"))


def test_no_gpu_compiler_names_what_to_set_instead(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path / "empty")}
    cuda = llama_build.cuda_target(env, arch="90")
    assert not cuda.buildable and "nvcc" in cuda.missing
    assert "LLAMA_BIN=/path/to/llama-server kvlab run all" in cuda.missing
    amd = Hardware(True, "amd-smi names 1 AMD GPU(s)", "discrete", ("MI300X gfx942",), "amd")
    rocm = llama_build.rocm_target(amd, env)
    assert rocm.key == "rocm-gfx942" and "hipcc" in rocm.missing
    hipcc = _tool(tmp_path / "rocm" / "bin" / "hipcc")
    rocm = llama_build.rocm_target(amd, {**env, "ROCM_PATH": str(tmp_path / "rocm")})
    assert rocm.buildable and "-DAMDGPU_TARGETS=gfx942" in rocm.cmake_flags
    assert rocm.env["HIP_PATH"] == str(hipcc.parent.parent)


def test_the_cpu_and_metal_builds_where_no_gpu_is_in_use() -> None:
    assert llama_build.target(Settings(), "abc", hw=NO_GPU, env={}, system="Linux").key \
        == "native-abc"
    assert llama_build.target(Settings(), "abc", hw=NO_GPU, env={}, system="Darwin").device \
        == "metal"
    # the CPU profile asked for by name keeps the CPU build beside a GPU
    cpu = Settings(kvlab_profile="cpu-tiny")
    assert llama_build.target(cpu, "abc", hw=H200, env={}, system="Linux").device == "cpu"


def test_the_cuda_build_configures_for_the_gpu_and_is_kept_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    _tool(tmp_path / "cuda" / "bin" / "nvcc")
    target = llama_build.cuda_target({"PATH": "", "CUDA_HOME": str(tmp_path / "cuda")}, "90")
    sdist = _fake_sdist(tmp_path)
    steps: list[list[str]] = []

    def step(argv: list[str], what: str, cwd: Path | None = None, log: Path | None = None,
             env: object = None) -> None:
        steps.append(argv)
        if what == "cmake build llama-server":
            _tool(Path(argv[argv.index("--build") + 1]) / "bin" / "llama-server")

    monkeypatch.setattr(install, "_run", step)
    monkeypatch.setattr(install, "_sdist", lambda *_: sdist)
    monkeypatch.setattr(install, "_check_provenance", lambda _: None)
    built = install.build_llama_server(home, target=target)
    assert built == install.llama_server_path(home, target)
    assert "cuda-sm90" in built.parent.name and built.is_file()
    assert install.installed_llama_server(home) is None  # the CPU's build is another one
    configure = steps[0]
    assert {"-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_NATIVE=ON",
            "-DBUILD_SHARED_LIBS=OFF"} <= set(configure)


def _fake_sdist(root: Path) -> Path:
    tree = root / "sdist" / f"llama_cpp_python-{install.LLAMA_CPP_PYTHON_VERSION}" / "vendor" \
        / "llama.cpp"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("", encoding="utf-8")
    path = root / "sdist.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(root / "sdist" / tree.parents[1].name, arcname=tree.parents[1].name)
    return path


def test_a_gpu_profile_without_nvcc_installs_nothing_for_the_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> Path:
        raise AssertionError("nothing may be built or installed here")

    monkeypatch.setattr(install, "_run", refuse)
    monkeypatch.setattr(install, "install_mlx", refuse)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    settings = Settings(kvlab_home=str(tmp_path / "home"), kvlab_profile="gpu")
    said: list[str] = []
    prepare_engines(settings, (LLAMA_CPP, MLX_LM), said.append)
    assert any("nvcc" in s and "not run" in s for s in said), said
    assert any(s.startswith("mlx-lm: ") and "not run" in s for s in said), said
    assert not (tmp_path / "home" / "engines").exists()
    assert "LLAMA_BIN" in llamacpp.not_found(settings)
