"""`kvlab run shared-slots`: one slot store, two llama-servers, reuse proven on the second.

The lab says two replicas do not share a cache unless you give them one; on llama.cpp the
slot store is that cache. Server A and server B run with the same model and flags and the
same `--slot-save-path`. A prefills a long prompt cold and saves the slot (with kvlab's
manifest); B restores the file (after the manifest check against B) and answers the same
prompt. Reuse on B is proven by `timings.cache_n` covering the prompt, and the KV content by
B's first-token top logprobs equal to A's cold prefill within `LOGPROB_TOLERANCE`; B's own cold
prefill on another slot is the control (no reuse, the same logprobs).

The line is a `reuse` record in the seed's shape (label, model, endpoints, turns, rows of turn,
endpoint, ttft_s, total_s, chunks) with this evidence added.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.core.errors import SettingError
from kvlab.core.say import Say, quiet
from kvlab.core.settings import Settings
from kvlab.engines import llamacpp, startup
from kvlab.engines.llamacpp import server as llama_common
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget, logprob_gap
from kvlab.experiments.disk import CONTROL_FRACTION, LOGPROB_TOLERANCE, REUSE_FRACTION, turn
from kvlab.measure.chat import ChatResult
from kvlab.records import notebook


@dataclass(frozen=True)
class SharedSlotsSpec:
    """Both servers' settings (identical) and the prompt."""

    prompt_tokens: int = 2000
    ctx: int = 8192
    parallel: int = 2
    max_tokens: int = 8
    cache_ram_mib: int = 0
    label: str = "shared-store"
    keep_file: bool = False

    def check(self) -> None:
        llama_common.check_fits(self.prompt_tokens, self.max_tokens, self.ctx, self.parallel)
        if self.parallel < 2:
            raise SettingError("--parallel must be 2 or more: B's cold control runs on a "
                               "second slot")


async def run_shared_slots(settings: Settings, binary: Path, spec: SharedSlotsSpec,
                           say: Say = quiet) -> dict[str, Any]:
    """Save on A, restore on B, prove reuse on B; the `reuse` record (not yet appended)."""
    spec.check()
    store = slotstore.SlotStore(Path(settings.llama_slot_save_path))
    accepted = llamacpp.help_flags(binary)
    plans = [llama_common.server_plan(settings, binary, role=f"shared-slots-{name}",
                                      ctx=spec.ctx, parallel=spec.parallel,
                                      slot_dir=store.directory,
                                      cache_ram_mib=spec.cache_ram_mib, accepted=accepted)
             for name in ("a", "b")]
    name = f"kvlab-shared-{plans[0].port}.bin"
    hashes = slotstore.hash_cache_path(settings.home())
    say(f"servers A {plans[0].base_url} and B {plans[1].base_url}, one store {store.directory}")
    async with llama_common.engine(settings, plans[0]) as proc_a, \
            llama_common.engine(settings, plans[1]) as proc_b:
        version = await startup.server_version(plans[0])
        async with LlamaClient(LlamaTarget.from_plan(plans[0], proc_a.log_path),
                               settings.api_key()) as a, \
                LlamaClient(LlamaTarget.from_plan(plans[1], proc_b.log_path),
                            settings.api_key()) as b:
            try:
                steps = await _steps(a, b, store, name, spec, hashes, settings, say)
            finally:
                if not spec.keep_file:
                    store.slot_path(name).unlink(missing_ok=True)
                    store.manifest_path(name).unlink(missing_ok=True)
    server = llama_common.server_fields(plans[0], spec.ctx, spec.parallel, spec.cache_ram_mib)
    return shared_record(spec, steps, server, version, plans[0].model,
                         [plans[0].base_url, plans[1].base_url])


async def _steps(a: LlamaClient, b: LlamaClient, store: slotstore.SlotStore, name: str,
                 spec: SharedSlotsSpec, hashes: Path, settings: Settings,
                 say: Say) -> dict[str, Any]:
    async def ask(client: LlamaClient, prompt: str, slot: int) -> ChatResult:
        return await client.chat(prompt, slot=slot, max_tokens=spec.max_tokens,
                                 model=settings.served_name)

    prompt = await llama_common.prompt_of(a, spec.prompt_tokens)
    warm = await llama_common.prompt_of(a, 32, seed=99)
    for client in (a, b):  # model residency is not cache state
        await ask(client, warm, spec.parallel - 1)
    say(f"A: cold prefill of {spec.prompt_tokens} tokens on slot 0, then save")
    cold_a = await ask(a, prompt, 0)
    save_op, manifest = await slotstore.save(a, store, 0, name, hashes)
    say("B: restore A's file into slot 0, then the same prompt")
    restore_op, _ = await slotstore.restore(b, store, 0, name, hashes)
    restored_b = await ask(b, prompt, 0)
    say("B: the same prompt cold on slot 1 (the control)")
    await b.erase(1)
    cold_b = await ask(b, prompt, 1)
    return {"cold_a": cold_a, "restored_b": restored_b, "cold_b": cold_b, "save": save_op,
            "restore": restore_op, "manifest": manifest}


def shared_verdict(cold_a: ChatResult, restored_b: ChatResult, cold_b: ChatResult,
                   prompt_total: int) -> tuple[str, list[str], float | None]:
    reasons = []
    reused = int((restored_b.timings or {}).get("cache_n", 0))
    control = int((cold_b.timings or {}).get("cache_n", 0))
    if reused < REUSE_FRACTION * prompt_total:
        reasons.append(f"B reused only {reused} of {prompt_total} prompt tokens after restore")
    if control > CONTROL_FRACTION * prompt_total:
        reasons.append(f"B's cold control reused {control} tokens: it was not cold")
    gap = logprob_gap(cold_a.first_logprobs, restored_b.first_logprobs)
    if gap is None or gap > LOGPROB_TOLERANCE:
        reasons.append(f"B's first-token logprobs differ from A's cold prefill ({gap})")
    return ("not proven" if reasons else "reuse proven"), reasons, gap


def shared_record(spec: SharedSlotsSpec, steps: dict[str, Any], server: dict[str, Any],
                  version: str, model: str, endpoints: list[str]) -> dict[str, Any]:
    cold_a, restored_b, cold_b = steps["cold_a"], steps["restored_b"], steps["cold_b"]
    t = cold_a.timings or {}
    prompt_total = int(t.get("prompt_n", 0)) + int(t.get("cache_n", 0))
    status, reasons, gap = shared_verdict(cold_a, restored_b, cold_b, prompt_total)
    rows = [{"turn": 1, "endpoint": endpoints[0], "ttft_s": turn(cold_a)["ttft_s"],
             "total_s": round(cold_a.total_s, 4), "chunks": cold_a.chunks},
            {"turn": 2, "endpoint": endpoints[1], "ttft_s": turn(restored_b)["ttft_s"],
             "total_s": round(restored_b.total_s, 4), "chunks": restored_b.chunks}]
    return notebook.envelope(
        "reuse", spec.label, notebook.LAB_OFFLOAD, engine="llama.cpp", engine_version=version,
        model=model, model_sha256=steps["manifest"].model_sha256, endpoints=endpoints, turns=2,
        prompt_tokens=prompt_total, max_tokens=spec.max_tokens, rows=rows, metric_deltas={},
        mechanism="llama.cpp slot store shared by two servers (save on A, restore on B)",
        **llamacpp.kv_label(server["kv_type_k"], server["kv_type_v"]),
        verdict=status, reasons=reasons,
        evidence={"cold_a": turn(cold_a), "restored_b": turn(restored_b),
                  "cold_b_control": turn(cold_b), "logprob_max_abs_diff": gap,
                  "logprob_tolerance": LOGPROB_TOLERANCE, "save": steps["save"].as_dict(),
                  "restore": steps["restore"].as_dict()},
        server=server,
        note=("turn 2 is the same prompt on the second server after restoring the first "
              "server's saved slot; the store is shared, the servers are not"),
    )
