"""Engines kvlab started and did not stop: their PID records, and the proof they are ours.

When kvlab starts an engine it writes a PID record under KVLAB_HOME/run/pids (process group,
start time, port, and the kvlab process that owns it); `kvlab clean` reads them back. A
recorded group is stopped only when kvlab can prove it is the one it started (the leader's start
time, or members that serve the port or started after it), never by argv0, which a wrapper
script (`VLLM_CMD`) changes; and never while the kvlab that started it still runs (another
`kvlab run` in progress: its engines are not strays).

Deliberately not here: writing the record when an engine starts (`process.py`), stopping a
group (`process_groups.py`), and what `kvlab clean` reports (`cleanup.py`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvlab.engines.process_groups import stop_group

if TYPE_CHECKING:
    import psutil

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
    owner: int | None = None  # the kvlab process that started it and will stop it
    owner_start: float | None = None  # that process's start time (psutil's)
    log: str = ""
    identified_by: str | None = None  # set when found running: how it was proven ours
    file: str = Field("", exclude=True)  # where the record was read from

    @property
    def group(self) -> int:
        return self.pgid if self.pgid is not None else self.pid

    @property
    def start(self) -> float | None:
        return self.create_time or self.started

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
    """The recorded engines still running, each proven to be the one kvlab started, whose
    kvlab is gone."""
    found = [(r, identify(r)) for r in stray_records(run_dir) if not owner_alive(r)]
    return [r.model_copy(update={"identified_by": how}) for r, how in found if how is not None]


def owned_elsewhere(run_dir: Path) -> list[PidRecord]:
    """The recorded engines a kvlab still running started: not strays, left alone."""
    return [r for r in stray_records(run_dir) if owner_alive(r) and identify(r) is not None]


OWNER_FILE = ".kvlab-owner"  # in a run's store or scratch directory: the kvlab using it


def claim(directory: Path) -> None:
    """Mark `directory` (a run's stores or scratch) as this kvlab's while it runs, so that
    another kvlab's `kvlab clean` leaves it alone."""
    mine = PidRecord(pid=os.getpid(), create_time=_process_start(os.getpid()))
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(mine.model_dump_json(exclude_none=True) + "\n")


def release(directory: Path) -> None:
    """Drop this kvlab's mark on `directory` (its run is over)."""
    (directory / OWNER_FILE).unlink(missing_ok=True)


def claimed(directory: Path) -> int | None:
    """The PID of the running kvlab that claimed `directory`, or None (none did, or it is
    gone)."""
    try:
        mark = PidRecord.model_validate_json((directory / OWNER_FILE).read_bytes())
    except (OSError, ValidationError):
        return None
    alive = _same_process(mark.pid, mark.create_time)
    return mark.pid if alive else None


def _process_start(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _same_process(pid: int, start: float | None) -> bool:
    """Whether `pid` runs and is the process that started at `start` (any, where unknown)."""
    now = _process_start(pid)
    return now is not None and (start is None or abs(now - start) <= _START_SLACK_S)


def owner_alive(record: PidRecord) -> bool:
    """Whether the kvlab process that started the engine still runs (its PID with the start
    time it had): a detached engine has no owner (`kvlab serve --detach` hands it on)."""
    if record.owner is None or record.detached:
        return False
    return _same_process(record.owner, record.owner_start)


def stop_strays(run_dir: Path, grace_s: float = 5.0) -> list[PidRecord]:
    """Stop every recorded engine group still alive whose kvlab is gone; remove their records.
    Returns those stopped."""
    stopped = []
    for record in stray_records(run_dir):
        if owner_alive(record):
            continue  # its kvlab stops it, and removes the record
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
