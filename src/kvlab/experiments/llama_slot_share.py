"""`kvlab run shared-slots`: one slot store, two llama-servers, reuse proven on the second.

The lab says two replicas do not share a cache unless you give them one; on llama.cpp the
slot store is that cache. Server A and server B run with the same model and flags and the
same `--slot-save-path`. A prefills a long prompt cold and saves the slot (with kvlab's
manifest); B restores the file (after the manifest check against B) and answers the same
prompt. Reuse on B is proven by `timings.cache_n` covering the prompt, and the KV content by
B's first-token top logprobs equal to A's cold prefill; B's own cold prefill on another slot is
the control (no reuse). The protocol and its judge are `engines/llamacpp/roundtrip.py`'s.

The line is a `reuse` record in the seed's shape (label, model, endpoints, turns, rows of turn,
endpoint, ttft_s, total_s, chunks) with this evidence added.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvlab.core import SettingError
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
from kvlab.records import (
    SHARED_SLOTS,
    LlamaServerLine,
    Record,
    ReuseRecord,
    ReuseRow,
    SlotEvidence,
    notebook,
)


@dataclass(frozen=True)
class SharedSlotsSpec(SlotRunSpec):
    """Both servers' settings (identical) and the prompt."""

    label: str = SHARED_SLOTS.label  # its own row: a slot file moved between two servers

    def check(self) -> None:
        super().check()
        if self.parallel < 2:
            raise SettingError("--parallel must be 2 or more: B's cold control runs on a "
                               "second slot")


def all_spec(lab: Lab, sizes: AllSpec) -> SharedSlotsSpec:
    """The shared slot store at `kvlab run all`'s sizes."""
    return SharedSlotsSpec(prompt_tokens=min(2000, sizes.disk_prompt_tokens))


async def run(lab: Lab, spec: SharedSlotsSpec) -> list[Record]:
    """Save on A, restore on B, prove reuse on B; the `reuse` line it wrote."""
    spec.check()
    settings, binary = lab.settings, llamacpp.require_llama_server(lab.settings)
    store = SlotStore(Path(settings.llama_slot_save_path))
    accepted = llamacpp.help_flags(binary)
    plans = [server_plan(settings, binary, role=f"shared-slots-{name}",
                                      ctx=spec.ctx, parallel=spec.parallel,
                                      slot_dir=store.directory,
                                      cache_ram_mib=spec.cache_ram_mib, accepted=accepted)
             for name in ("a", "b")]
    name = f"kvlab-shared-{plans[0].port}.bin"
    lab.say(f"servers A {plans[0].base_url} and B {plans[1].base_url}, "
            f"one store {store.directory}")
    async with engines(lab, plans, labels=[f"{spec.label}-{n}" for n in ("a", "b")],
                       ready_timeout_s=READY_S) as (proc_a, proc_b):
        plans = [proc_a.plan, proc_b.plan]  # as started: a kept engine has its own port
        version = await startup.server_version(plans[0])
        async with LlamaClient(LlamaTarget.from_plan(plans[0], proc_a.log_path),
                               settings.api_key()) as a, \
                LlamaClient(LlamaTarget.from_plan(plans[1], proc_b.log_path),
                            settings.api_key()) as b:
            try:
                trip = await _round_trip(lab, a, b, store, name, spec)
            finally:
                if not spec.keep_file:
                    store.remove(name)
    server = server_fields(plans[0], spec.ctx, spec.parallel, spec.cache_ram_mib)
    return [lab.record(shared_record(spec, trip, server, version, plans[0].model,
                                     [plans[0].base_url, plans[1].base_url]))]


async def _round_trip(lab: Lab, a: LlamaClient, b: LlamaClient, store: SlotStore,
                      name: str, spec: SharedSlotsSpec) -> RoundTrip:
    async def ask(client: LlamaClient, prompt: str, slot: int) -> ChatResult:
        return await client.chat(prompt, slot=slot, max_tokens=spec.max_tokens,
                                 model=lab.settings.served_name)

    prompt = await prompt_of(a, spec.prompt_tokens)
    warm = await prompt_of(a, 32, seed=99)
    for client in (a, b):  # model residency is not cache state
        await ask(client, warm, spec.parallel - 1)

    async def cold() -> ChatResult:
        lab.say(f"A: cold prefill of {spec.prompt_tokens} tokens on slot 0, then save")
        return await ask(a, prompt, 0)

    async def again() -> ChatResult:
        lab.say("B: the same prompt on slot 0, restored from A's file")
        return await ask(b, prompt, 0)

    async def control() -> ChatResult:
        lab.say("B: the same prompt cold on slot 1 (the control)")
        await b.erase(1)
        return await ask(b, prompt, 1)

    return await llamacpp.roundtrip.round_trip(
        store, name, llamacpp.roundtrip.Slot(a, 0), llamacpp.roundtrip.Slot(b, 0),
        llamacpp.roundtrip.Asks(cold, again, control), lab.settings.paths().file_hashes,
        lab.say)


def shared_record(spec: SharedSlotsSpec, trip: RoundTrip, server: LlamaServerLine,
                  version: str, model: str, endpoints: list[str]) -> ReuseRecord:
    cold_a, restored_b, cold_b = trip.cold, trip.restored, trip.control
    judged = llamacpp.roundtrip.judge(cold_a, cold_b, restored_b)
    turn = llamacpp.roundtrip.turn
    rows = [ReuseRow(turn=1, endpoint=endpoints[0], ttft_s=turn(cold_a).ttft_s,
                     total_s=round(cold_a.total_s, 4), chunks=cold_a.chunks),
            ReuseRow(turn=2, endpoint=endpoints[1], ttft_s=turn(restored_b).ttft_s,
                     total_s=round(restored_b.total_s, 4), chunks=restored_b.chunks)]
    line = ReuseRecord(
        label=spec.label, lab=notebook.LAB_OFFLOAD, engine=LLAMA_CPP, engine_version=version,
        model=model, model_sha256=trip.manifest.model_sha256, endpoints=endpoints, turns=2,
        prompt_tokens=judged.prompt_tokens, max_tokens=spec.max_tokens, rows=rows,
        metric_deltas={},
        mechanism="llama.cpp slot store shared by two servers (save on A, restore on B)",
        verdict=judged.verdict, reasons=judged.reasons,
        evidence=SlotEvidence(cold_a=turn(cold_a), restored_b=turn(restored_b),
                              cold_b_control=turn(cold_b),
                              logprob_max_abs_diff=judged.logprob_gap,
                              logprob_tolerance=LOGPROB_TOLERANCE,
                              save=trip.save.as_record(), restore=trip.restore.as_record()),
        server=server,
        note=("turn 2 is the same prompt on the second server after restoring the first "
              "server's saved slot; the store is shared, the servers are not"),
    )
    return line.overlay(llamacpp.kv_label(server.kv_type_k or "f16", server.kv_type_v))
