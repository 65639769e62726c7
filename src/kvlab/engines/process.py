"""Running an engine process properly: own session, ready check, clean stop, log file.

- start: a new session (so the engine's helper processes share its process group), output to
  a log file, a PID record under KVLAB_HOME/run (process group, start time, port) so
  `kvlab clean` can find strays; on Linux the engine gets SIGTERM when kvlab dies, even by
  SIGKILL (the parent-death signal), unless it was started detached;
- ready: the health URL answers 200 AND the process is alive, within a monotonic deadline; a
  process that exits during start raises with the tail of its log;
- stop: SIGTERM to the whole group, a grace period, then SIGKILL; always, via `async with`;
- strays: a recorded group is stopped only when kvlab can prove it is the one it started (the
  leader's start time, or members that serve the port or started after it), never by argv0,
  which a wrapper script (`VLLM_CMD`) changes.

The engine is spawned with the plan's real argv (`exec_argv`); what this module shows (the
log echoed, a log tail in an error) has the plan's secrets redacted. This module knows no
engine: the plan says what to run and where health is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvlab.core import EngineError, RefusedError, redact_text
from kvlab.engines.plan import EnginePlan

if TYPE_CHECKING:
    import psutil

DEFAULT_READY_TIMEOUT_S = 600.0
STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_START_SLACK_S = 2.0  # a recorded start time against psutil's (clock ticks, rounding)


class PidRecord(BaseModel):
    """What kvlab writes under KVLAB_HOME/run/pids when it starts an engine, so `kvlab clean`
    can find it if kvlab did not stop it. Older kvlabs wrote fewer keys (pid, argv0,
    started); keys this one does not know are ignored."""

    model_config = ConfigDict(extra="ignore")

    pid: int
    pgid: int | None = None  # the group the engine leads (its pid)
    engine: str = ""
    role: str = ""
    port: int = 0
    argv0: str = ""
    started: float | None = None  # time.time() when spawned
    create_time: float | None = None  # the kernel's, through psutil
    detached: bool = False
    log: str = ""
    identified_by: str | None = None  # set when found running: how it was proven ours
    file: str = Field("", exclude=True)  # where the record was read from

    @property
    def group(self) -> int:
        return self.pgid if self.pgid is not None else self.pid

    @property
    def start(self) -> float | None:
        return self.create_time or self.started


def port_in_use(host: str, port: int) -> bool:
    """Whether something already accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


_GIVEN: set[int] = set()  # ports free_port handed out in this process
_GIVEN_LOCK = threading.Lock()


def free_port() -> int:
    """A port the kernel says is free right now on loopback, and one this process has not
    handed out before: plans are made before their engines bind, and the kernel can give
    the same free port twice in a row (two engines of one run then shared one port, and each
    one's readiness probe was answered by the other)."""
    with _GIVEN_LOCK:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port
    raise EngineError("no free loopback port this process has not used already")


class EngineProcess:
    """One engine started from a plan; use `async with` so it is always stopped."""

    def __init__(
        self,
        plan: EnginePlan,
        log_path: Path,
        *,
        run_dir: Path | None = None,
        secret_env: dict[str, str] | None = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
        echo: TextIO | None = None,
        detached: bool = False,
    ) -> None:
        self.plan = plan
        self.log_path = log_path
        self.run_dir = run_dir
        self._secret_env = secret_env or {}
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self._echo = echo
        # detached: may outlive kvlab (no parent-death signal; left running on a clean exit)
        self.detached = detached
        self._shown_secrets = plan.secrets() | set((secret_env or {}).values())
        self._proc: subprocess.Popen[bytes] | None = None
        self._echo_task: asyncio.Task[None] | None = None
        self.ready_s: float | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def start(self) -> None:
        """Spawn the process (its own session), after checking the port is free."""
        if port_in_use(self.plan.client_host, self.plan.port):
            raise EngineError(
                f"port {self.plan.port} on {self.plan.client_host} is already in use; stop what "
                f"listens there or choose another port for the {self.plan.role} instance"
            )
        for d in self.plan.private_dirs:
            make_private_dir(Path(d))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.plan.env, **self._secret_env, "PYTHONUNBUFFERED": "1"}
        preexec = None if self.detached else parent_death_signal()
        # the engine writes its own log and may print its arguments: this account only
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    self.plan.exec_argv(), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                    preexec_fn=preexec,  # one prctl call, bound before the fork
                )
            except OSError as exc:
                raise EngineError(
                    f"cannot run {self.plan.argv()[0]} for the {self.plan.role} instance: {exc}"
                ) from None
        self._record_pid()

    async def wait_ready(self) -> float:
        """Seconds until health answered; raises if the process dies or the deadline passes."""
        assert self._proc is not None, "start() first"
        started = time.monotonic()
        deadline = started + self.ready_timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise EngineError(
                        f"{self.plan.engine} ({self.plan.role}) exited with code {code} during "
                        f"start; {self.log_path}: {self.log_tail(3)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(self.plan.health_url)
                    if response.status_code == 200 and self._proc.poll() is None:
                        self.ready_s = time.monotonic() - started
                        return self.ready_s
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"{self.plan.engine} ({self.plan.role}) not ready after "
                        f"{self.ready_timeout_s:.0f} s at {self.plan.health_url}; "
                        f"{self.log_path}: {self.log_tail(3)}"
                    )
                await asyncio.sleep(0.25)

    async def stop(self, grace_s: float | None = None) -> int | None:
        """TERM the process group, wait up to the grace period, then KILL; the exit code."""
        await self._stop_echo()
        proc = self._proc
        if proc is None:
            return None
        grace = self.stop_grace_s if grace_s is None else grace_s
        await asyncio.to_thread(stop_group, proc.pid, grace, proc.poll)
        code = await asyncio.to_thread(proc.wait)
        self._forget_pid()
        return code

    async def release(self) -> None:
        """Leave a detached engine running: stop echoing its log, keep its PID record for
        `kvlab clean`."""
        await self._stop_echo()

    async def _stop_echo(self) -> None:
        if self._echo_task is not None:
            self._echo_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._echo_task
            self._echo_task = None

    async def healthy(self) -> bool:
        """Alive and answering its health URL with 200 right now."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        try:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                return (await client.get(self.plan.health_url)).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_exit(self) -> int:
        """Wait for the process to exit by itself (it runs in the foreground)."""
        assert self._proc is not None, "start() first"
        return await asyncio.to_thread(self._proc.wait)

    def log_text(self) -> str:
        """The engine's log so far, with the plan's secrets redacted (engines print their
        arguments, `--api-key` included)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return redact_text(text, self._shown_secrets)

    def log_tail(self, lines: int = 3) -> str:
        tail = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) if tail else "(empty log)"

    def echo_log(self, out: TextIO) -> None:
        """Copy the log to `out` as it grows (foreground `kvlab serve`)."""
        self._echo_task = asyncio.get_running_loop().create_task(self._tail_to(out))

    async def _tail_to(self, out: TextIO) -> None:
        # a local log file read a line at a time: not worth a thread
        with open(self.log_path, encoding="utf-8", errors="replace") as f:  # noqa: ASYNC230
            pending = ""  # a line the engine has not finished writing: a secret may span it
            while True:
                pending += f.readline()
                if pending.endswith("\n"):
                    out.write(redact_text(pending, self._shown_secrets))
                    out.flush()
                    pending = ""
                else:
                    await asyncio.sleep(0.1)

    async def __aenter__(self) -> EngineProcess:
        self.start()
        try:
            if self._echo is not None:
                self.echo_log(self._echo)
            await self.wait_ready()
        except BaseException:
            await asyncio.shield(self.stop())
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.detached and exc_type is None and self.returncode is None:
            await self.release()
            return
        await asyncio.shield(self.stop())

    def _pid_file(self) -> Path | None:
        if self.run_dir is None or self._proc is None:
            return None
        return self.run_dir / "pids" / f"{self._proc.pid}.json"

    def _record_pid(self) -> None:
        path = self._pid_file()
        if path is None or self._proc is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        record = PidRecord(pid=self._proc.pid, pgid=self._proc.pid, engine=self.plan.engine,
                           role=self.plan.role, port=self.plan.port, argv0=self.plan.argv()[0],
                           started=time.time(), create_time=_create_time(self._proc.pid),
                           detached=self.detached, log=str(self.log_path))
        path.write_text(record.model_dump_json(exclude_none=True) + "\n", encoding="utf-8")

    def _forget_pid(self) -> None:
        path = self._pid_file()
        if path is not None:
            path.unlink(missing_ok=True)


def orphan_note(proc: EngineProcess, system: str = sys.platform) -> str:
    """Said where an engine would outlive a killed kvlab: no parent-death signal on this
    system (PR_SET_PDEATHSIG is Linux's); "" where there is one, or for a detached engine."""
    if proc.detached or system.startswith("linux"):
        return ""
    return (f"{system} has no parent-death signal (Linux's PR_SET_PDEATHSIG): if kvlab is "
            "killed, this engine keeps running; `kvlab clean` stops it")


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


def make_private_dir(path: Path) -> None:
    """Create `path` (and parents) readable by this account only, or accept an existing one
    that is safe as it is: it will hold prompts.

    kvlab never changes the mode of a directory it did not create (`LLAMA_SLOT_SAVE_PATH=/tmp`
    made 0700 would lock every other user out of /tmp). An existing directory, or the one a
    symlink given as the setting points to, is refused when every user may write into it or
    another account owns it. One it creates is opened without following symlinks before its
    mode is set, so a link planted in a shared parent cannot redirect the chmod.
    """
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
        created = True
    except FileExistsError:
        created = False
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if created else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise RefusedError(f"{path} cannot be used as a private directory "
                           f"({exc.strerror}); choose a directory of your own") from None
    try:
        if created:
            os.fchmod(fd, 0o700)  # the umask may have taken the owner's bits
        else:
            _check_safe_dir(path, os.fstat(fd))
    finally:
        os.close(fd)


def _check_safe_dir(path: Path, st: os.stat_result) -> None:
    """Refuse an existing directory others can write into or that another account owns."""
    if st.st_uid != os.geteuid():
        raise RefusedError(
            f"{path} belongs to another account (uid {st.st_uid}): kvlab keeps prompts only "
            "in a directory you own; choose a path of your own (kvlab creates it 0700)")
    if st.st_mode & stat.S_IWOTH:
        raise RefusedError(
            f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}): kvlab "
            "keeps prompts only in a directory of its own and never changes a directory it "
            "did not create; choose a new path (kvlab creates it 0700)")


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


def stray_records(run_dir: Path) -> list[PidRecord]:
    """PID records of engines kvlab started that were not stopped through kvlab (an
    unreadable one is removed: it can prove nothing)."""
    out = []
    for path in sorted((run_dir / "pids").glob("*.json")):
        try:
            record = PidRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            path.unlink(missing_ok=True)
            continue
        record.file = str(path)
        out.append(record)
    return out


def live_strays(run_dir: Path) -> list[PidRecord]:
    """The recorded engines still running, each proven to be the one kvlab started."""
    found = [(r, identify(r)) for r in stray_records(run_dir)]
    return [r.model_copy(update={"identified_by": how}) for r, how in found if how is not None]


def stop_strays(run_dir: Path, grace_s: float = 5.0) -> list[PidRecord]:
    """Stop every recorded engine group still alive; remove the records. Returns those stopped."""
    stopped = []
    for record in stray_records(run_dir):
        how = identify(record)
        if how is not None:
            stop_group(record.pid, grace_s)
            stopped.append(record.model_copy(update={"identified_by": how}))
        Path(record.file).unlink(missing_ok=True)
    return stopped


def identify(record: PidRecord) -> str | None:
    """How a PID record is proven to still be kvlab's engine group, or None (gone, or the PID
    now belongs to another program).

    The process group id is the leader's PID. While the leader lives, its start time must
    equal the recorded one. Once it has exited, the kernel does not reuse its PID while group
    members remain, and those members must serve the recorded port or have started after the
    engine did. argv0 proves nothing: a wrapper script (`VLLM_CMD`) execs another program.
    """
    import psutil

    pgid, started = record.group, record.start
    try:
        leader = psutil.Process(pgid)
        if leader.status() != psutil.STATUS_ZOMBIE:
            same = started is not None and abs(leader.create_time() - started) <= _START_SLACK_S
            return "start time" if same else None
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return None
    members = group_members(pgid)
    if not members:
        return None
    if any(_serves_port(m, record.port) for m in members):
        return "process group and port"
    if started is not None and all(_created(m) >= started - _START_SLACK_S
                                   for m in members):
        return "process group and start time"
    return None


def group_members(pgid: int) -> list[psutil.Process]:
    """The live processes of a process group."""
    import psutil

    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


def _serves_port(proc: psutil.Process, port: int) -> bool:
    import psutil

    if port <= 0:
        return False
    try:
        conns = proc.net_connections(kind="inet")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in conns)


def _created(proc: psutil.Process) -> float:
    import psutil

    try:
        return float(proc.create_time())
    except psutil.Error:
        return 0.0


def _create_time(pid: int) -> float | None:
    """The process's start time as psutil reports it (seconds since the epoch)."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None
