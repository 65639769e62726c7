"""`kvlab run disk`: the lab's stopwatch for llama.cpp's disk tier (slot save and restore).

One server, one long prompt on slot 0, in this order:
  warm-up (another prompt, then erased: model residency is not cache state)
  -> cold (full prefill, the TTFT to beat) -> save -> erase
  -> control: the same prompt with no restore, which must show no reuse
  -> erase -> restore -> the same prompt on the restored slot.
The server runs with the in-RAM prompt cache off (`--cache-ram 0`) by default, because that
cache can hand an erased prompt back and fake a restore; the control proves it did not. Reuse
is proven by `timings.cache_n`, and the KV content by first-token top logprobs equal to the
cold prefill's within `LOGPROB_TOLERANCE`. The `disk` notebook line holds the headline figures
(cold TTFT, save and restore ms, file bytes, post-restore TTFT and cached tokens, the
restore/cold ratio), the server settings chosen, and this evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvlab.core.say import Say, quiet
from kvlab.core.settings import Settings
from kvlab.engines import llamacpp, startup
from kvlab.engines.llamacpp import server as llama_common
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import LlamaClient, LlamaTarget, logprob_gap
from kvlab.measure.chat import ChatResult
from kvlab.records import notebook

LOGPROB_TOLERANCE = 1e-3
REUSE_FRACTION = 0.95    # post-restore cache_n must cover this share of the prompt
CONTROL_FRACTION = 0.05  # the control may reuse at most this share (template tokens)
SLOT = 0


@dataclass(frozen=True)
class DiskSpec:
    """The experiment's own server settings and prompt; recorded in its notebook line."""

    prompt_tokens: int = 3500
    ctx: int = 8192
    parallel: int = 2
    max_tokens: int = 8
    top_logprobs: int = 5
    cache_ram_mib: int = 0
    label: str = "disk"
    keep_file: bool = False

    def check(self) -> None:
        llama_common.check_fits(self.prompt_tokens, self.max_tokens, self.ctx, self.parallel)


def turn(result: ChatResult) -> dict[str, Any]:
    """One request's evidence: client TTFT and the server's reuse counts."""
    t = result.timings or {}
    return {"ttft_s": round(result.ttft_s, 4) if result.ttft_s is not None else None,
            "total_s": round(result.total_s, 4), "cache_n": t.get("cache_n"),
            "prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"),
            "top_logprobs": [[tok, round(lp, 6)] for tok, lp in result.first_logprobs]}


async def run_disk(settings: Settings, binary: Path, spec: DiskSpec,
                   say: Say = quiet) -> dict[str, Any]:
    """Run the stopwatch once and return the `disk` record (not yet appended)."""
    spec.check()
    store = slotstore.SlotStore(Path(settings.llama_slot_save_path))
    plan = llama_common.server_plan(settings, binary, role="disk", ctx=spec.ctx,
                                    parallel=spec.parallel, slot_dir=store.directory,
                                    cache_ram_mib=spec.cache_ram_mib)
    name = f"kvlab-disk-{plan.port}.bin"
    hashes = slotstore.hash_cache_path(settings.home())
    say(f"starting llama-server (ctx {spec.ctx}, {spec.parallel} slots, "
        f"--cache-ram {spec.cache_ram_mib}) on {plan.base_url}")
    proc = llama_common.engine(settings, plan)
    async with proc:
        version = await startup.server_version(plan)
        async with LlamaClient(LlamaTarget.from_plan(plan, proc.log_path),
                               settings.api_key()) as client:
            try:
                steps = await _steps(client, store, name, spec, hashes, settings, say)
            finally:
                if not spec.keep_file:
                    store.slot_path(name).unlink(missing_ok=True)
                    store.manifest_path(name).unlink(missing_ok=True)
        capacity = startup.capacity(plan, proc.log_text())
    server = {**llama_common.server_fields(plan, spec.ctx, spec.parallel, spec.cache_ram_mib),
              "capacity": capacity}
    return disk_record(settings, spec, steps, server, version, plan.model, store, name)


async def _steps(client: LlamaClient, store: slotstore.SlotStore, name: str, spec: DiskSpec,
                 hashes: Path, settings: Settings, say: Say) -> dict[str, Any]:
    async def ask(prompt: str) -> ChatResult:
        return await client.chat(prompt, slot=SLOT, max_tokens=spec.max_tokens,
                                 top_logprobs=spec.top_logprobs, model=settings.served_name)

    prompt = await llama_common.prompt_of(client, spec.prompt_tokens)
    say("warm-up on another prompt, then erase")
    await ask(await llama_common.prompt_of(client, 64, seed=99))
    await client.erase(SLOT)
    say(f"cold prefill of {spec.prompt_tokens} tokens on slot {SLOT}")
    cold = await ask(prompt)
    save_op, manifest = await slotstore.save(client, store, SLOT, name, hashes)
    say(f"saved {save_op.n_tokens} tokens ({save_op.n_bytes} bytes) in {save_op.wall_ms:.1f} ms")
    await client.erase(SLOT)
    say("control: the same prompt after erase, no restore (must show no reuse)")
    control = await ask(prompt)
    await client.erase(SLOT)
    restore_op, _ = await slotstore.restore(client, store, SLOT, name, hashes)
    say(f"restored {restore_op.n_tokens} tokens in {restore_op.wall_ms:.1f} ms; asking again")
    restored = await ask(prompt)
    return {"cold": cold, "control": control, "restored": restored, "save": save_op,
            "restore": restore_op, "manifest": manifest}


def verdict(cold: ChatResult, control: ChatResult, restored: ChatResult,
            prompt_total: int) -> tuple[str, list[str], float | None]:
    """('reuse proven' | 'not proven', reasons, logprob gap) from the three turns."""
    reasons = []
    reused = int((restored.timings or {}).get("cache_n", 0))
    faked = int((control.timings or {}).get("cache_n", 0))
    if reused < REUSE_FRACTION * prompt_total:
        reasons.append(f"after restore only {reused} of {prompt_total} prompt tokens were reused")
    if faked > CONTROL_FRACTION * prompt_total:
        reasons.append(f"the control reused {faked} tokens without a restore: another cache "
                       "(e.g. --cache-ram) could be faking the result")
    gap = logprob_gap(cold.first_logprobs, restored.first_logprobs)
    if gap is None:
        reasons.append("first-token logprobs missing or not comparable")
    elif gap > LOGPROB_TOLERANCE:
        reasons.append(f"first-token logprobs differ from the cold prefill by {gap:.2e}")
    elif cold.first_logprobs[0][0] != restored.first_logprobs[0][0]:
        reasons.append("the most likely first token differs from the cold prefill's")
    return ("not proven" if reasons else "reuse proven"), reasons, gap


def disk_record(settings: Settings, spec: DiskSpec, steps: dict[str, Any],
                server: dict[str, Any], version: str, model: str,
                store: slotstore.SlotStore, name: str) -> dict[str, Any]:
    cold, control, restored = steps["cold"], steps["control"], steps["restored"]
    save_op, restore_op, manifest = steps["save"], steps["restore"], steps["manifest"]
    timings = cold.timings or {}
    prompt_total = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
    status, reasons, gap = verdict(cold, control, restored, prompt_total)
    cold_ms = (cold.ttft_s or 0.0) * 1000
    cold_prompt_ms = float(timings.get("prompt_ms") or 0.0)
    return notebook.envelope(
        "disk", spec.label, notebook.LAB_OFFLOAD,
        engine="llama.cpp", engine_version=version, model=model,
        model_sha256=manifest.model_sha256,
        **llamacpp.kv_label(server["kv_type_k"], server["kv_type_v"]),
        prompt_tokens=prompt_total, max_tokens=spec.max_tokens,
        cold_ttft_s=round(cold_ms / 1000, 4), save_ms=round(save_op.wall_ms, 3),
        save_server_ms=save_op.server_ms, restore_ms=round(restore_op.wall_ms, 3),
        restore_server_ms=restore_op.server_ms, file_bytes=save_op.n_bytes,
        saved_tokens=save_op.n_tokens, restored_tokens=restore_op.n_tokens,
        post_restore_ttft_s=turn(restored)["ttft_s"],
        post_restore_cached_tokens=(restored.timings or {}).get("cache_n"),
        restore_cold_ratio=round(restore_op.wall_ms / cold_ms, 5) if cold_ms else None,
        restore_cold_ratio_server=(round(restore_op.server_ms / cold_prompt_ms, 5)
                                   if restore_op.server_ms and cold_prompt_ms else None),
        verdict=status, reasons=reasons,
        evidence={"cold": turn(cold), "control": turn(control), "restored": turn(restored),
                  "logprob_max_abs_diff": gap, "logprob_tolerance": LOGPROB_TOLERANCE,
                  "save": save_op.as_dict(), "restore": restore_op.as_dict(),
                  "slot_file": str(store.slot_path(name)), "file_kept": spec.keep_file},
        server=server,
        note=("restore_ms and save_ms are HTTP wall times measured by kvlab; *_server_ms are "
              "llama-server's own timings; the ratio is restore wall ms / cold TTFT ms"),
    )
