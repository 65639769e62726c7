"""Why the host tier cost time: the controls run after the pressure pair (issue 46).

When the tier-on run's TTFT p50 was not clearly below the tier-off run's (more than 0.9x of
it), or when `--why` asks, two measurements follow on the same engines where they are still up
(`kvlab run all` starts them together), else on engines started again:
- the same sessions with each conversation's own opening (`distinct_opening`: no cache block is
  shared across conversations), tier off and on. vLLM's offloading connector is reported to
  hold every request that shares a block being loaded until the load ends (vLLM issue 44294);
  user sessions share their first block (the chat template and the system line), so first
  turns, which recall nothing, wait behind other users' recalls. If the tier's cost on first
  turns goes with the shared block, it goes away here;
- the machine's copy rate with the engine's own framework (`engines.copyrate`): the floor a
  recall of the tier-on run's bytes could not beat.
The report (`report/why_tier.py`) reads them beside the pair with the engine's own accounts
(TTFT's queue and prefill, the tier's load time). This module measures; it decides nothing
but whether to run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict

from kvlab.core import EngineError
from kvlab.engines import VLLM, copyrate
from kvlab.experiments.lab import Lab
from kvlab.records import (
    COPY_RATE,
    PRESSURE_OFF,
    PRESSURE_ON,
    CopyRateRecord,
    LoadRecord,
    Record,
    notebook,
)

WHY_MODES = ("auto", "always", "never")
PAID_BELOW = 0.9  # a tier-on TTFT p50 under this share of the tier-off one paid: no controls

# runs one side's pressure sessions with no block shared across conversations (one run, no
# capacity search), tier on (True) or off
Side = Callable[[bool], Awaitable[list[Record]]]


def wanted(mode: str, rows: Sequence[Record]) -> tuple[bool, str]:
    """Whether to run the controls, and why (said in the progress lines)."""
    if mode == "never":
        return False, "--why never"
    if mode == "always":
        return True, "--why always"
    on, off = _p50(rows, PRESSURE_ON.label), _p50(rows, PRESSURE_OFF.label)
    if on is None or off is None or off <= 0:
        return False, "the pair has no TTFT p50 on both sides"
    ratio = on / off
    if ratio < PAID_BELOW:
        return False, f"the tier paid (TTFT p50 x{ratio:.2f})"
    return True, f"the tier did not pay (TTFT p50 x{ratio:.2f} of the tier off)"


def _p50(rows: Sequence[Record], label: str) -> float | None:
    found = [r.ttft_s.p50 for r in rows if isinstance(r, LoadRecord) and r.label == label
             and r.ttft_s is not None and r.ttft_s.p50 is not None]
    return sum(found) / len(found) if found else None


async def controls(lab: Lab, mode: str, rows: Sequence[Record], side: Side) -> list[Record]:
    """The controls, when `wanted` (`mode`: auto, always, never): the copy rate, then the
    distinct-opening sessions tier off and on."""
    run, why = wanted(mode, rows)
    if not run:
        if mode != "never":
            lab.say(f"    why: no controls ({why})")
        return []
    lab.say(f"==> why: {why}; the controls: the copy rate, then the same sessions with no "
            "block shared across conversations, tier off and on")
    out: list[Record] = [await copy_rate(lab)]
    for on in (False, True):
        out += await side(on)
    return out


async def copy_rate(lab: Lab) -> Record:
    """The copy-rate line, or a not-run line saying why it could not be measured."""
    python = getattr(lab.install(VLLM), "python", None)  # the engine's, where kvlab knows it
    try:
        found = await asyncio.to_thread(copyrate.measure, python)
        line = CopyRateRecord(lab=notebook.LAB_OFFLOAD, label=COPY_RATE.label, **asdict(found))
    except EngineError as e:
        return lab.not_run(COPY_RATE, str(e))
    lab.say(f"    copy rate: {line.gb_per_s:.1f} GB/s {line.direction} ({line.device}, "
            f"{line.framework})")
    return lab.record(line)
