"""Process groups of engines: stop one, tell whether it lives, and tie an engine to kvlab.

An engine runs in a session of its own, so its helper processes share its process group:
`stop_group` sends the whole group SIGTERM, waits a grace period for it to empty, then sends
SIGKILL. `parent_death_signal` makes Linux send the engine SIGTERM when kvlab dies, however
it dies.

Deliberately not here: spawning the engine (`process.py`) and proving that a recorded group is
still kvlab's before it is stopped (`strays.py`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal() -> Callable[[], None] | None:
    """A preexec function that makes Linux send the engine SIGTERM when kvlab dies, however
    it dies (SIGKILL included), so no engine outlives the kvlab that started it; None where
    the kernel has no such signal.

    The kernel sends it when the *thread* that forked the child exits, not the process: a
    spawn from a worker thread (`asyncio.to_thread`) would stop the engine as soon as that
    thread is retired. So it is only set when spawning from the main thread, which lives
    exactly as long as kvlab; `kvlab clean` covers the rest. SIGTERM rather than SIGKILL
    lets the engine stop its own helper processes. prctl is looked up here, before the fork,
    so the child runs one foreign call and no Python imports.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not \
            threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # kvlab died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec

def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace_s: float = STOP_GRACE_S,
               reap: Callable[[], object] | None = None) -> None:
    """SIGTERM a process group, wait for it to empty, SIGKILL what is left (blocking).

    `reap` collects the leader's exit status when it is our child (a zombie leader would keep
    the group looking alive); by default a plain waitpid is tried.
    """
    collect = reap or (lambda: _waitpid(pgid))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        collect()
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):
        collect()
        if not group_alive(pgid):
            return
        time.sleep(0.1)


def _waitpid(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
