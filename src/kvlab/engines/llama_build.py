"""Which llama-server build suits this machine: the device it runs on, the compiler that
builds for it, and the cmake flags.

llama.cpp compiles its backends in, so kvlab keeps one build per target under KVLAB_HOME
(`engines/llama-server-<commit>-<key>`): the CPU's (keyed by the CPU's instruction sets, since
a `-march=native` binary must never run on a CPU without them), CUDA's (keyed by the GPU's
compute capability; `nvcc` from PATH, CUDA_HOME or /usr/local/cuda), ROCm's (keyed by the
gfx target; `hipcc` from PATH, ROCM_PATH or /opt/rocm) and Metal's (macOS). The device is the
one vLLM's choice follows (`core.profiles.wants_gpu`), so a GPU machine gets a GPU build or
none: the CPU's would run the llama.cpp rows on the wrong device. Where the GPU's compiler is
missing, `Target.missing` says what to set instead. Everything here only looks;
`install.build_llama_server` builds.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.core import Hardware, Settings, cuda_architecture, detect_hardware, wants_gpu

# h200.sh's llama-cuda phase built with these (277 s with ninja on 16 cores)
CUDA_FLAGS = ("-DGGML_CUDA=ON", "-DLLAMA_CURL=OFF")
HIP_FLAGS = ("-DGGML_HIP=ON", "-DLLAMA_CURL=OFF")
METAL_FLAGS = ("-DGGML_METAL=ON",)
FIX = "LLAMA_BIN=/path/to/llama-server kvlab run all"
CUDA_ROOT, ROCM_ROOT = "/usr/local/cuda", "/opt/rocm"  # where the toolkits install by default


@dataclass(frozen=True)
class Target:
    """One llama-server build: the device, its cache key and how to compile it."""

    device: str  # "cpu", "cuda", "rocm" or "metal"
    key: str  # the build directory's suffix
    cmake_flags: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    compiler: str = ""  # the device compiler found (nvcc, hipcc); "" where none is needed
    missing: str = ""  # why it cannot be built here, and what to set instead ("" if it can)

    @property
    def buildable(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        """One phrase for progress lines and not-run reasons."""
        return {"cpu": "this CPU", "metal": "Metal"}.get(self.device, self.device.upper()) \
            + (f" ({self.key})" if self.device in ("cuda", "rocm") else "")


def cpu_target(isa_key: str) -> Target:
    return Target("cpu", f"native-{isa_key}")


def target(settings: Settings, isa_key: str, hw: Hardware | None = None,
           env: Mapping[str, str] | None = None, system: str | None = None) -> Target:
    """The build for this machine's device (`hw`, `env` and `system` are detected unless
    given)."""
    hw = hw or detect_hardware()
    env = os.environ if env is None else env
    if wants_gpu(settings, hw):
        return rocm_target(hw, env) if hw.vendor == "amd" else cuda_target(env)
    if (system or platform.system()) == "Darwin":
        return Target("metal", "metal", METAL_FLAGS)
    return cpu_target(isa_key)


def cuda_target(env: Mapping[str, str], arch: str | None = None) -> Target:
    """CUDA: nvcc, and the GPU's own architecture (CMake's "native" if nvidia-smi cannot
    say)."""
    arch = arch or cuda_architecture() or "native"
    nvcc = _compiler("nvcc", env, ("CUDA_HOME", "CUDA_PATH"), CUDA_ROOT)
    flags = (*CUDA_FLAGS, f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    if nvcc is None:
        return Target("cuda", f"cuda-sm{arch}", flags, missing=(
            "no nvcc (CUDA's compiler) on PATH, in CUDA_HOME or in /usr/local/cuda to build "
            f"llama-server for this GPU: point LLAMA_BIN at a CUDA build (`{FIX}`)"))
    return Target("cuda", f"cuda-sm{arch}", (*flags, f"-DCMAKE_CUDA_COMPILER={nvcc}"),
                  compiler=str(nvcc))


def rocm_target(hw: Hardware, env: Mapping[str, str]) -> Target:
    """ROCm: hipcc, ROCm's clang as the HIP compiler, and the GPU's gfx target."""
    gfx = next((m.group(0) for name in hw.gpus if (m := re.search(r"gfx[0-9a-f]+", name))),
               "")
    key = f"rocm-{gfx or 'any'}"
    flags = (*HIP_FLAGS, *((f"-DAMDGPU_TARGETS={gfx}",) if gfx else ()))
    hipcc = _compiler("hipcc", env, ("ROCM_PATH", "HIP_PATH"), ROCM_ROOT)
    if hipcc is None:
        return Target("rocm", key, flags, missing=(
            "no hipcc (ROCm's compiler) on PATH, in ROCM_PATH or in /opt/rocm to build "
            f"llama-server for this GPU: point LLAMA_BIN at a ROCm build (`{FIX}`)"))
    root = hipcc.parent.parent
    return Target("rocm", key, flags, {"HIPCXX": str(root / "llvm" / "bin" / "clang"),
                                       "HIP_PATH": str(root)}, compiler=str(hipcc))


def _compiler(name: str, env: Mapping[str, str], roots: tuple[str, ...],
              default_root: str) -> Path | None:
    """`name` on PATH, else under one of the `roots` variables' bin/, else the default's."""
    found = shutil.which(name, path=env.get("PATH"))
    if found:
        return Path(found)
    for root in (*(env.get(r, "") for r in roots), default_root):
        candidate = Path(root) / "bin" / name
        if root and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None
