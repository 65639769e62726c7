"""A start together that dies for memory is retried once, one engine after the other
(`together.held`), on stand-in engines that fail on cue as the H200's shared pair did: each
marks itself starting for four seconds, and one that finds another engine starting meanwhile
prints vLLM's own line and exits, as an engine profiling memory while another starts does.
Engines started one after the other never meet. What is checked is what kvlab does with the
failure: the retry said, and recorded on each retried engine's startup line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvlab.core.settings import Settings
from kvlab.engines import StartFailed
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port
from kvlab.experiments import together
from kvlab.experiments.lab import Lab
from kvlab.records import StartupRecord, notebook

GIB = 2**30
LINE = ("ValueError: To serve at least one request with the model's max seq len (8192), 0.88 "
        "GiB KV cache is needed, which is larger than the available KV cache memory (0.8 GiB).")
ENGINE = """
import os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        return

def alive(marker):
    try:
        os.kill(int(marker.name), 0)
    except OSError:
        return False  # killed while it started: its memory is free again
    return True

port, room, line = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
mine = room / str(os.getpid())
mine.touch()
deadline = time.monotonic() + 4.0  # "profiling": another engine starting meanwhile spoils it
while time.monotonic() < deadline:
    if any(p != mine and alive(p) for p in room.iterdir()):
        print("INFO profiling memory", flush=True)
        print(f"(EngineCore_DP0 pid={os.getpid()}) {line}", flush=True)
        mine.unlink()
        sys.exit(1)
    time.sleep(0.05)
mine.unlink()
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def plans(tmp_path: Path, line: str) -> list[EnginePlan]:
    script, room = tmp_path / "engine.py", tmp_path / "room"
    script.write_text(ENGINE, encoding="utf-8")
    room.mkdir(exist_ok=True)
    out = []
    for role in ("shared-a", "shared-b"):
        port = free_port()
        out.append(EnginePlan(engine="vllm", role=role, command=(sys.executable, str(script)),
                              positional=(str(port), str(room), line), port=port))
    return out


def planned(labels: list[str]) -> together.MemoryPlan:
    wants = [together.Want(label, "/models/small", 7 * GIB) for label in labels]
    return together.MemoryPlan(
        "together", 0.4, tuple(together.Placed(w, 3 * GIB, 3 * GIB, GIB // 2, GIB // 2, 0)
                               for w in wants),
        together.Device(140 * GIB, 0.85, "a device"), "planned for the test")


async def test_a_pair_that_dies_for_memory_together_starts_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    said: list[str] = []
    lab = Lab(Settings(), say=said.append)
    labels = ["shared-store-a", "shared-store-b"]
    memory = planned(labels)
    made = [together.stamped(p, memory, label)
            for p, label in zip(plans(tmp_path, LINE), labels, strict=True)]
    async with together.held(lab, made, labels, memory) as procs:
        assert [p.plan.role for p in procs] == ["shared-a", "shared-b"]
        assert all(p.returncode is None for p in procs)
    assert any("start failed for memory (To serve at least one request" in s for s in said)
    assert any("start again one at a time" in s for s in said)
    lines = notebook.read(Path(lab.settings.labbook)).of(StartupRecord)
    assert [r.label for r in lines] == labels
    for line in lines:
        assert line.device_plan is not None and line.device_plan.start == "one at a time"
        assert line.device_plan.retried_after == LINE[LINE.index("To serve"):]
        assert line.device_plan.cache_bytes == 7 * GIB
        assert line.start_batch is None  # each started alone


async def test_a_start_that_dies_for_another_cause_is_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    said: list[str] = []
    lab = Lab(Settings(), say=said.append)
    labels = ["shared-store-a", "shared-store-b"]
    with pytest.raises(StartFailed, match="exited with code 1 during start"):
        async with together.held(lab, plans(tmp_path, "RuntimeError: no model here"), labels,
                                 planned(labels)):
            pass
    assert not any("start failed for memory" in s for s in said)
    assert not lab.written  # nothing started, nothing recorded


async def test_sides_started_together_are_retried_the_same_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The offload lab's and the split's path: each side's plans made in a thread, started
    as soon as they are; after a death for memory, every side's engines one at a time."""
    import contextlib

    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    said: list[str] = []
    lab = Lab(Settings(), say=said.append)
    labels = ["offload-off", "offload-on"]
    memory = planned(labels)
    made = plans(tmp_path, LINE)
    sides = [lambda i=i: ([together.stamped(made[i], memory, labels[i])], [labels[i]])
             for i in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        given = await together.start(lab, stack, sides, memory)
        assert sorted(given) == labels
        assert all(p.returncode is None for p in given.values())
    assert all(p.returncode is not None for p in given.values())  # stopped with the stack
    assert any("start again one at a time" in s for s in said)
    lines = notebook.read(Path(lab.settings.labbook)).of(StartupRecord)
    assert sorted(r.label for r in lines) == labels
    assert all(r.device_plan and r.device_plan.retried_after for r in lines)
