"""`kvlab run all`: every experiment this machine can run, then the report.

Order: the llama.cpp tiers first (seconds), then the vLLM experiments (offload, shared store,
prefill/decode). Each experiment starts and stops its own engines; an experiment that fails
(an engine that dies, a refused configuration) is recorded as a `not-run` line for its rows
with the error, everything it started is stopped, and the rest still run. Sizes: `Sizes.lab()`
are the labs' own; `Sizes.quick()` are for CI and a first look.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kvlab.core.errors import KvlabError
from kvlab.experiments.disagg import DisaggSpec, run_disagg
from kvlab.experiments.lab import Lab
from kvlab.experiments.offload import OffloadSpec, run_offload
from kvlab.experiments.shared import SharedSpec, run_shared
from kvlab.records import notebook

Step = Callable[[], Awaitable[list[dict[str, Any]]]]
# the report rows each experiment fills, to say why they are empty when it fails
ROWS = {
    "disk": [(notebook.LAB_OFFLOAD, "disk", "Disk, llama.cpp slot save and restore")],
    "interference": [(notebook.LAB_PD, "interference", "llama-server, 4 slots against 1 slot")],
    "offload": [(notebook.LAB_OFFLOAD, "offload-off", "None, quiet server"),
                (notebook.LAB_OFFLOAD, "offload-off-load", "None, cache under pressure")],
    "shared": [(notebook.LAB_OFFLOAD, "shared-store", "Shared store, two instances")],
    "disagg": [(notebook.LAB_PD, "baseline", "One machine, no split (baseline)"),
               (notebook.LAB_PD, "disagg-loopback", "Two processes on one device")],
}


@dataclass(frozen=True)
class Sizes:
    turns: int
    preamble_words: int
    offload_concurrency: int
    levels: tuple[int, ...]
    requests: int
    max_tokens: int
    preamble_tokens: int
    disk_prompt_tokens: int

    @classmethod
    def lab(cls, levels: tuple[int, ...], requests: int, max_tokens: int,
            preamble_tokens: int, preamble_words: int) -> Sizes:
        return cls(6, preamble_words, 8, levels, requests, max_tokens, preamble_tokens, 3500)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(3, 400, 2, (1, 2), 4, 8, 300, 3000)


def steps(lab: Lab, sizes: Sizes) -> dict[str, Step]:
    """Each experiment as a call that returns the lines it wrote."""
    s = lab.settings
    return {
        "disk": lambda: _disk(lab, sizes),
        "interference": lambda: _interference(lab, sizes),
        "offload": lambda: run_offload(lab, OffloadSpec(
            turns=sizes.turns, preamble_words=sizes.preamble_words,
            concurrency=sizes.offload_concurrency, load_max_tokens=sizes.max_tokens,
            preamble_tokens=sizes.preamble_tokens)),
        "shared": lambda: run_shared(lab, SharedSpec(
            turns=sizes.turns, preamble_words=sizes.preamble_words,
            proof_preamble_words=min(600, sizes.preamble_words))),
        "disagg": lambda: run_disagg(lab, DisaggSpec(
            levels=sizes.levels, requests=sizes.requests, max_tokens=sizes.max_tokens,
            preamble_tokens=sizes.preamble_tokens, prompt_set=s.prompt_set)),
    }


async def run_all(lab: Lab, sizes: Sizes, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run every (or each named) experiment; failures are recorded, not fatal to the rest."""
    done: dict[str, Any] = {}
    for name, step in steps(lab, sizes).items():
        if only and name not in only:
            continue
        lab.say(f"\n######## {name}")
        try:
            done[name] = {"ok": True, "lines": len(await step())}
        except KvlabError as exc:
            lab.say(f"    {name} failed: {exc}")
            for lab_name, label, row in ROWS[name]:
                lab.not_run(lab_name, label, row, f"the {name} experiment failed: {exc}")
            done[name] = {"ok": False, "error": str(exc)}
    return done


NO_LLAMA = ("llama-server is not installed on this machine: `kvlab engines install` builds it "
            "(CPU), or set LLAMA_BIN to a build for this machine's accelerator")


def _llama_or_not_run(lab: Lab, name: str) -> Any:
    from kvlab.engines import llamacpp

    binary = llamacpp.find_llama_server(lab.settings)
    if binary is None:
        for lab_name, label, row in ROWS[name]:
            lab.not_run(lab_name, label, row, NO_LLAMA)
    return binary


async def _disk(lab: Lab, sizes: Sizes) -> list[dict[str, Any]]:
    from kvlab.experiments.disk import DiskSpec, run_disk

    binary = _llama_or_not_run(lab, "disk")
    if binary is None:
        return []
    spec = DiskSpec(prompt_tokens=sizes.disk_prompt_tokens)
    spec.check()
    return [lab.record(await run_disk(lab.settings, binary, spec, say=lab.say))]


async def _interference(lab: Lab, sizes: Sizes) -> list[dict[str, Any]]:
    from kvlab.experiments.interference import InterferenceSpec, run_interference

    binary = _llama_or_not_run(lab, "interference")
    if binary is None:
        return []
    settings = lab.settings.model_copy(update={"prompt_set": "mixed"})
    spec = InterferenceSpec(requests=max(sizes.requests, 8), max_tokens=sizes.max_tokens,
                            prompt_set="mixed", ctx=settings.ctx)
    spec.budget()
    rows, comparison = await run_interference(settings, binary, spec, say=lab.say)
    return [lab.record(line) for line in [*rows, comparison]]
