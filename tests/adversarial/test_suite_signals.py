"""The suite works when started as a background job, where SIGINT arrives ignored, and a
child that ignores every stop signal is still stopped, with what it started.

`nohup make test &` from a script starts pytest with SIGINT ignored, and every child it
starts inherits that: a test that stops `kvlab proxy` with Ctrl-C waited for a proxy that
never heard it, and left it running. Here a pytest started that way runs such a test: it
must pass, leave no process behind, and not need the session's safety net (conftest) to
stop one.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from children import descendants, running, stop

ROOT = Path(__file__).resolve().parents[2]
CTRL_C_TEST = "tests/unit/proxy/test_workers.py::test_ctrl_c_stops_every_worker"
STUBBORN = """
import signal, subprocess, sys, time
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print("started", flush=True)
time.sleep(120)
"""


def as_a_background_job() -> None:
    """What a shell without job control does to `cmd &`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def started_under(base: Path, settle_s: float = 5.0) -> list[str]:
    """Live processes that name `base` in their argv, working directory or environment,
    once none is left or `settle_s` has passed."""
    deadline = time.monotonic() + settle_s
    while (found := _naming(str(base))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _naming(marker: str) -> list[str]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            seen = [*proc.cmdline(), proc.cwd(), *proc.environ().values()]
            if any(marker in s for s in seen):
                found.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:160]}")
    return found


def test_a_ctrl_c_test_passes_with_sigint_ignored_and_leaves_nothing(tmp_path: Path) -> None:
    base = tmp_path / "inner"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--basetemp={base}", CTRL_C_TEST]
    with running(argv, preexec=as_a_background_job, cwd=ROOT, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True) as inner:
        out, _ = inner.communicate(timeout=240)
        left = started_under(base)
    assert inner.returncode == 0, f"{out[-3000:]}\nleft running: {left}"
    assert left == [], left
    assert "left processes running" not in out, out  # the session's safety net had to act


def test_a_child_that_ignores_sigint_and_sigterm_is_killed_with_what_it_started() -> None:
    with running([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stdout.readline() == "started\n"
        (sleeper,) = descendants(child.pid)  # in a session of its own, out of the group
        code = stop(child, signal.SIGINT, timeout=0.5, grace_s=0.5)
    assert code == -signal.SIGKILL
    assert not sleeper.is_running() or sleeper.status() == psutil.STATUS_ZOMBIE
