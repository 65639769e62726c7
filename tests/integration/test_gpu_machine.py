"""`kvlab run all` as a new user runs it on a GPU machine that has no llama-server and no CUDA
compiler: the `gpu` profile, nothing built or installed for the CPU, and every llama.cpp (and
mlx-lm) row recorded as not run with the one thing that fixes it.

The GPU is faked, as hardware this machine lacks: an `nvidia-smi` on PATH that lists an H200,
and a `vllm` on PATH for vLLM's GPU choice (no vLLM experiment is asked for, so it never
runs). This machine's own /usr/local/cuda is hidden from the child (a `sitecustomize`), so
the GPU has no nvcc to build llama-server with. No engine starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvlab.records import notebook
from kvlab.records.models import NotRunRecord

NVIDIA_SMI = """#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)";;
  *compute_cap*) echo "9.0";;
  *) echo "NVIDIA H200, 143771";;
esac
"""
LLAMA_LABELS = {"disk", "interference", "llama-prompt-off", "llama-ram-on-load",
                "llama-kv-quant", "shared-slots"}


def _fake_gpu_machine(root: Path) -> dict[str, str]:
    bin_dir, site = root / "bin", root / "site"
    bin_dir.mkdir()
    site.mkdir()
    for name, text in (("nvidia-smi", NVIDIA_SMI), ("vllm", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    (site / "sitecustomize.py").write_text(
        f"import sys\nif sys.prefix == {sys.prefix!r}:\n"
        "    import kvlab.engines.llama_build as b\n"
        f"    b.CUDA_ROOT = {str(root / 'no-cuda')!r}\n", encoding="utf-8")
    system = [d for d in os.environ.get("PATH", "").split(os.pathsep)
              if d and not any((Path(d) / n).exists() for n in ("llama-server", "nvcc", "vllm"))]
    return {"PATH": os.pathsep.join([str(bin_dir), *system]),
            "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_a_gpu_machine_without_llama_server_builds_nothing_and_says_why(tmp_path: Path) -> None:
    home, book = tmp_path / "home", tmp_path / "labbook.md"
    env = {**os.environ, **_fake_gpu_machine(tmp_path), "KVLAB_HOME": str(home),
           "LABBOOK": str(book), "MODEL": str(tmp_path / "no-model")}
    for name in ("VLLM_CMD", "LLAMA_BIN", "KVLAB_PROFILE", "CUDA_HOME", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    only = [a for n in ("disk", "mlx-cache", "shared-slots", "interference", "llama-tiers")
            for a in ("--only", n)]
    run = subprocess.run([sys.executable, "-m", "kvlab", "run", "all", "--quick", *only],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "profile gpu" in run.stdout + run.stderr
    assert not (home / "engines").exists()  # nothing built, nothing installed
    assert not (home / "sources").exists()  # nothing downloaded either
    assert "downloading" not in run.stdout + run.stderr

    skipped = {r.label: r.reason for r in notebook.read(book).of(NotRunRecord)}
    assert set(skipped) >= LLAMA_LABELS, sorted(skipped)
    for label in LLAMA_LABELS:
        assert "nvcc" in skipped[label], skipped[label]
        assert "LLAMA_BIN=/path/to/llama-server kvlab run all" in skipped[label]
    assert skipped["mlx-cache"].startswith("mlx-lm is Apple's engine")


def test_a_gpu_machine_with_nvcc_builds_no_llama_server_when_there_is_no_gguf(
        tmp_path: Path) -> None:
    """With a CUDA compiler, kvlab would build llama-server (minutes); without LLAMA_MODEL
    there is nothing for it to serve, so the rows say that instead of building."""
    env = {**os.environ, **_fake_gpu_machine(tmp_path), "KVLAB_HOME": str(tmp_path / "home"),
           "LABBOOK": str(tmp_path / "labbook.md"), "MODEL": str(tmp_path / "no-model")}
    cuda = tmp_path / "no-cuda" / "bin"
    cuda.mkdir(parents=True)
    (cuda / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0'\n",
                               encoding="utf-8")
    (cuda / "nvcc").chmod(0o755)
    for name in ("VLLM_CMD", "LLAMA_BIN", "LLAMA_MODEL", "KVLAB_PROFILE", "CUDA_HOME"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, "-m", "kvlab", "run", "all", "--quick",
                          "--only", "disk", "--only", "interference"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "downloading" not in run.stdout + run.stderr
    assert not (tmp_path / "home" / "sources").exists()
    skipped = {r.label: r.reason for r in notebook.read(tmp_path / "labbook.md").of(NotRunRecord)}
    assert {"disk", "interference"} <= set(skipped), sorted(skipped)
    for label in ("disk", "interference"):
        why = skipped[label]
        assert why.startswith("no GGUF for llama-server: set LLAMA_MODEL"), why
        assert "kvlab engines install --only llama" in why, why
