"""`kvlab run disk`: the lab's stopwatch for llama.cpp's disk tier (slot save and restore).

One server, one long prompt on slot 0, in this order:
  warm-up (another prompt, then erased: model residency is not cache state)
  -> cold (full prefill, the TTFT to beat) -> save -> erase
  -> control: the same prompt with no restore, which must show no reuse
  -> erase -> restore -> the same prompt on the restored slot.
The server runs with the in-RAM prompt cache off (`--cache-ram 0`) by default, because that
cache can hand an erased prompt back and fake a restore; the control proves it did not. Reuse
is proven by `timings.cache_n`, and the KV content by first-token top logprobs equal to the
cold prefill's (the protocol and its judge are `engines/llamacpp/roundtrip.py`'s, shared with
`kvlab run shared-slots` and `kvlab prove`). The `disk` notebook line holds the headline figures
(cold TTFT, save and restore ms, file bytes, post-restore TTFT and cached tokens, the
restore/cold ratio), the server settings chosen, and this evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvlab.engines import LLAMA_CPP, llamacpp, startup
from kvlab.engines.llamacpp import (
    READY_S,
    LlamaClient,
    LlamaTarget,
    RoundTrip,
    SlotRunSpec,
    SlotStore,
    prompt_of,
    server_fields,
    server_plan,
)
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.sizes import AllSpec
from kvlab.observe import LOGPROB_TOLERANCE, ChatResult
from kvlab.records import DiskRecord, LlamaServerLine, Record, SlotEvidence, notebook

SLOT = 0


@dataclass(frozen=True)
class DiskSpec(SlotRunSpec):
    """The stopwatch's server and prompt; recorded in its notebook line."""

    prompt_tokens: int = 3500
    top_logprobs: int = 5
    label: str = "disk"


def all_spec(lab: Lab, sizes: AllSpec) -> DiskSpec:
    """The disk tier at `kvlab run all`'s sizes."""
    return DiskSpec(prompt_tokens=sizes.disk_prompt_tokens)


async def run(lab: Lab, spec: DiskSpec) -> list[Record]:
    """Run the stopwatch once; the `disk` line it wrote."""
    spec.check()
    settings, binary = lab.settings, llamacpp.require_llama_server(lab.settings)
    store = SlotStore(Path(settings.llama_slot_save_path))
    plan = server_plan(settings, binary, role="disk", ctx=spec.ctx, parallel=spec.parallel,
                       slot_dir=store.directory, cache_ram_mib=spec.cache_ram_mib)
    name = f"kvlab-disk-{plan.port}.bin"
    lab.say(f"starting llama-server (ctx {spec.ctx}, {spec.parallel} slots, "
            f"--cache-ram {spec.cache_ram_mib}) on {plan.base_url}")
    async with engines(lab, [plan], labels=[spec.label], ready_timeout_s=READY_S) as (proc,):
        plan = proc.plan  # as started: a kept engine (run all) listens on its own port
        version = await startup.server_version(plan)
        async with LlamaClient(LlamaTarget.from_plan(plan, proc.log_path),
                               settings.api_key()) as client:
            try:
                trip = await _round_trip(lab, client, store, name, spec)
            finally:
                if not spec.keep_file:
                    store.remove(name)
        capacity = startup.capacity(plan, proc.log_text())
    server = server_fields(plan, spec.ctx, spec.parallel, spec.cache_ram_mib)
    server.capacity = capacity
    return [lab.record(disk_record(spec, trip, server, version, plan.model,
                                   str(store.slot_path(name))))]


async def _round_trip(lab: Lab, client: LlamaClient, store: SlotStore, name: str,
                      spec: DiskSpec) -> RoundTrip:
    async def ask(prompt: str) -> ChatResult:
        return await client.chat(prompt, slot=SLOT, max_tokens=spec.max_tokens,
                                 top_logprobs=spec.top_logprobs,
                                 model=lab.settings.served_name)

    prompt = await prompt_of(client, spec.prompt_tokens)
    lab.say("warm-up on another prompt, then erase")
    await ask(await prompt_of(client, 64, seed=99))
    await client.erase(SLOT)

    async def cold() -> ChatResult:
        lab.say(f"cold prefill of {spec.prompt_tokens} tokens on slot {SLOT}")
        return await ask(prompt)

    async def control() -> ChatResult:
        lab.say("control: the same prompt after erase, no restore (must show no reuse)")
        return await ask(prompt)

    async def again() -> ChatResult:
        lab.say("the same prompt on the restored slot")
        return await ask(prompt)

    here = llamacpp.roundtrip.Slot(client, SLOT)
    return await llamacpp.roundtrip.round_trip(
        store, name, here, here,
        llamacpp.roundtrip.Asks(cold, again, control, control_before_restore=True),
        lab.settings.paths().file_hashes, lab.say)


def disk_record(spec: DiskSpec, trip: RoundTrip, server: LlamaServerLine, version: str,
                model: str, slot_file: str) -> DiskRecord:
    cold, control, restored = trip.cold, trip.control, trip.restored
    save_op, restore_op = trip.save, trip.restore
    judged = llamacpp.roundtrip.judge(cold, control, restored)
    cold_ms = (cold.ttft_s or 0.0) * 1000
    cold_prompt_ms = float((cold.timings or {}).get("prompt_ms") or 0.0)
    line = DiskRecord(
        label=spec.label, lab=notebook.LAB_OFFLOAD,
        engine=LLAMA_CPP, engine_version=version, model=model,
        model_sha256=trip.manifest.model_sha256,
        prompt_tokens=judged.prompt_tokens, max_tokens=spec.max_tokens,
        cold_ttft_s=round(cold_ms / 1000, 4), save_ms=round(save_op.wall_ms, 3),
        save_server_ms=save_op.server_ms, restore_ms=round(restore_op.wall_ms, 3),
        restore_server_ms=restore_op.server_ms, file_bytes=save_op.n_bytes,
        saved_tokens=save_op.n_tokens, restored_tokens=restore_op.n_tokens,
        post_restore_ttft_s=llamacpp.roundtrip.turn(restored).ttft_s,
        post_restore_cached_tokens=llamacpp.roundtrip.turn(restored).cache_n,
        restore_cold_ratio=round(restore_op.wall_ms / cold_ms, 5) if cold_ms else None,
        restore_cold_ratio_server=(round(restore_op.server_ms / cold_prompt_ms, 5)
                                   if restore_op.server_ms and cold_prompt_ms else None),
        verdict=judged.verdict, reasons=judged.reasons,
        evidence=SlotEvidence(cold=llamacpp.roundtrip.turn(cold),
                              control=llamacpp.roundtrip.turn(control),
                              restored=llamacpp.roundtrip.turn(restored),
                              logprob_max_abs_diff=judged.logprob_gap,
                              logprob_tolerance=LOGPROB_TOLERANCE,
                              save=save_op.as_record(), restore=restore_op.as_record(),
                              slot_file=slot_file, file_kept=spec.keep_file),
        server=server,
        note=("restore_ms and save_ms are HTTP wall times measured by kvlab; *_server_ms are "
              "llama-server's own timings; the ratio is restore wall ms / cold TTFT ms"),
    )
    return line.overlay(llamacpp.kv_label(server.kv_type_k or "f16", server.kv_type_v))
