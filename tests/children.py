"""Processes the suite starts: the signals tests send at their defaults, never left running.

A background job started without job control (`nohup make test &`) begins with SIGINT and
SIGQUIT ignored (nohup adds SIGHUP), and an ignored signal stays ignored across fork and
exec: a child started as it is ignores the Ctrl-C a test sends it, and Python gives it no
KeyboardInterrupt. So every child started here gets:

- SIGINT, SIGTERM, SIGQUIT and SIGHUP at their defaults (`restore_signals` does not do it:
  it only restores SIGPIPE and SIGXFSZ);
- a session and process group of its own, so it can be stopped as a group;
- a marker in its environment (`MARK`), which what it starts inherits: kvlab starts engines
  in sessions of their own, out of its group, and they may outlive it.

`stop` sends the test's signal and waits; then SIGTERM and SIGKILL to the group; then stops
what the child started that still runs (its process tree as it was, and every process with
its marker), and reaps. `running` and `async_running` call it in the test's own cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import psutil

SENT = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP)
MARK = "PYTEST_KVLAB_CHILD"  # "<pytest pid>-<n>": one value per child, inherited by its own
WAIT_S = 30.0  # for the child to obey the test's signal
GRACE_S = 10.0  # after SIGTERM, and after SIGKILL (engines stop their own helpers first)
_HELPERS = ("from multiprocessing.resource_tracker", "from multiprocessing.forkserver")
_count = itertools.count(1)
_marks: dict[int, str] = {}  # child pid -> its marker


def at_defaults(then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A preexec function: the signals tests send back at their defaults, then `then`."""

    def preexec() -> None:
        for signum in SENT:
            signal.signal(signum, signal.SIG_DFL)
        if then is not None:
            then()

    return preexec


def options(env: Mapping[str, str] | None = None,
            preexec: Callable[[], None] | None = None) -> dict[str, Any]:
    """Keyword arguments for Popen or create_subprocess_exec: signals at their defaults,
    a session of its own, a new marker in `env` (default: this environment)."""
    mark = f"{os.getpid()}-{next(_count)}"
    base = os.environ if env is None else env
    return {"env": {**base, MARK: mark}, "start_new_session": True,
            "preexec_fn": at_defaults(preexec)}


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          preexec: Callable[[], None] | None = None, **popen: Any) -> subprocess.Popen[Any]:
    """Popen(argv) as this module starts children; `stop` it (or use `running`)."""
    kw = options(env, preexec)
    proc: subprocess.Popen[Any] = subprocess.Popen(argv, **kw, **popen)
    _marks[proc.pid] = kw["env"][MARK]
    return proc


@contextlib.contextmanager
def running(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            preexec: Callable[[], None] | None = None,
            **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """`spawn`, and `stop` (SIGTERM first) however the test ends; its pipes closed."""
    proc = spawn(argv, env=env, preexec=preexec, **popen)
    try:
        yield proc
    finally:
        stop(proc, None)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def stop(proc: subprocess.Popen[Any], first: int | None = signal.SIGINT,
         timeout: float = WAIT_S, *, group: bool = False, grace_s: float = GRACE_S) -> int:
    """Send `first` (to the child's group when `group`) and wait up to `timeout` s; then
    SIGTERM and SIGKILL its group, `grace_s` apart; then stop whatever it started that still
    runs. Always reaps; the child's exit status (negative: the signal that ended it)."""
    family = descendants(proc.pid)
    if first is not None and proc.poll() is None:
        _send(proc.pid, first, group)
        _wait(proc, timeout)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is None:
            _send(proc.pid, signum, group=True)
            _wait(proc, grace_s)
    _leftovers(family, _marks.pop(proc.pid, None), grace_s)
    return proc.wait()


async def async_spawn(program: str, *args: str, env: Mapping[str, str] | None = None,
                      preexec: Callable[[], None] | None = None,
                      **kw: Any) -> asyncio.subprocess.Process:
    """create_subprocess_exec as this module starts children; `async_stop` it."""
    opts: dict[str, Any] = {**options(env, preexec), **kw}
    proc = await asyncio.create_subprocess_exec(program, *args, **opts)
    _marks[proc.pid] = opts["env"][MARK]
    return proc


@contextlib.asynccontextmanager
async def async_running(program: str, *args: str, env: Mapping[str, str] | None = None,
                        **kw: Any) -> AsyncIterator[asyncio.subprocess.Process]:
    """`async_spawn`, and `async_stop` (SIGTERM first) however the test ends."""
    proc = await async_spawn(program, *args, env=env, **kw)
    try:
        yield proc
    finally:
        await async_stop(proc, None)


async def async_stop(proc: asyncio.subprocess.Process, first: int | None = signal.SIGINT,
                     within_s: float = WAIT_S, *, group: bool = False,
                     grace_s: float = GRACE_S) -> int:
    """`stop` for a child of asyncio's (its event loop reaps it, so this never does)."""
    family = descendants(proc.pid)
    if first is not None and proc.returncode is None:
        _send(proc.pid, first, group)
        await _async_wait(proc, within_s)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if proc.returncode is None:
            _send(proc.pid, signum, group=True)
            await _async_wait(proc, grace_s)
    await asyncio.to_thread(_leftovers, family, _marks.pop(proc.pid, None), grace_s)
    return await proc.wait()


def descendants(pid: int) -> list[psutil.Process]:
    """The process tree under `pid` now (empty when it is gone)."""
    with contextlib.suppress(psutil.Error):
        return list(psutil.Process(pid).children(recursive=True))
    return []


def marked(value: str, *, prefix: bool = False) -> list[psutil.Process]:
    """Processes whose marker is `value` (starts with it, when `prefix`)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            mark = proc.environ().get(MARK)
            if mark is not None and (mark.startswith(value) if prefix else mark == value):
                found.append(proc)
    return found


def stop_all(procs: list[psutil.Process], grace_s: float = GRACE_S) -> list[str]:
    """SIGTERM the live ones, SIGKILL those left after `grace_s`; what each one was."""
    live = {p.pid: p for p in procs if _alive(p)}
    shown = [_describe(p) for p in live.values()]
    for proc in live.values():
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, left = psutil.wait_procs(list(live.values()), grace_s)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, grace_s)
    return shown


def session_leftovers(settle_s: float = 2.0) -> list[str]:
    """What this process started (its tree, and marked processes that left it) and still
    runs after `settle_s`, stopped; what each one was."""
    procs = [p for p in descendants(os.getpid()) + marked(f"{os.getpid()}-", prefix=True)
             if not _helper(p)]
    _, left = psutil.wait_procs([p for p in procs if _alive(p)], settle_s)
    return stop_all(left)


def _leftovers(family: list[psutil.Process], mark: str | None, grace_s: float) -> None:
    """Stop what a child that has exited left running, and say so (in the test's output)."""
    shown = stop_all(family + (marked(mark) if mark is not None else []), grace_s)
    if shown:
        print(f"children: stopped what the child left running: {shown}", file=sys.stderr)


def _send(pid: int, signum: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)


def _wait(proc: subprocess.Popen[Any], timeout: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)


async def _async_wait(proc: asyncio.subprocess.Process, within_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), within_s)


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _helper(proc: psutil.Process) -> bool:
    """multiprocessing's own helpers live as long as this process, by design."""
    with contextlib.suppress(psutil.Error):
        return any(h in " ".join(proc.cmdline()) for h in _HELPERS)
    return False


def _describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    return f"pid {proc.pid}"
