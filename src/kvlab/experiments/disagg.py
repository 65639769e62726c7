"""`kvlab run disagg`: the P/D lab on one machine, prediction first.

1. The prediction (payload, transfer time, TTFT better/worse) is written before anything
   starts, as the lab asks.
2. The split: a kv_producer and a kv_consumer on a fresh private ExampleConnector store,
   behind kvlab's own proxy (a separate process), `kvlab proxy --check` evidence that a request
   crossed both legs, then the load sweep with the link's counters around it (`disagg`).
3. The monolithic baseline with the same settings, the one variable changed (`baseline`).
4. The comparison, with bytes per request against the prediction, and the bytes the store
   actually grew by per request.
Everything is labelled `topology: loopback`: two processes on one machine measure no network.
The two-machine rows cannot be run from one machine and are recorded as such.

On a Ray cluster (`--cluster`, RAY_ADDRESS; `kvlab.cluster`) the same run places prefill on
PREFILL_HOST's node and decode and the baseline on DECODE_HOST's, refuses before anything
starts a model or engine missing on a node or a store the two nodes do not share, and records
the nodes' topology (two machines, or two Ray nodes on one machine) and each node's counters
around each load level; the proxy and the load generator run where kvlab runs. Its dry run
reads the cluster's nodes (`cluster/survey.py`) and shows the plans bound to them, with the
placement first (`DryPlacement`).

The lab's procedure steps are parts of the same run (`DisaggSpec.parts`, `--part`): `cancel`
(a request cancelled mid-stream, then the decode worker restarted, `procedure.py`) and
`boundary` (prompt lengths through the split and the baseline, `boundary.py`). The parts
share one pair stint and one baseline stint; `cancel` goes last in the pair's stint,
since it restarts decode. `load` alone is the default, the steps above. The load runs
`--repeat N` times a side, or with `--repeat auto[:CAP]` round by round until the split's
TTFT p50 over the baseline's settles at every level (`rounds.py`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

from kvlab.cluster.placement import DryPlacement, on_node
from kvlab.core import ConnectorName, SettingError, Settings, connectors, human_bytes
from kvlab.engines import (
    VLLM,
    EnginePlan,
    EngineProcess,
    KvStore,
    PlanRequest,
    engine_for,
    free_port,
    store_for,
)
from kvlab.experiments import repeats, together
from kvlab.experiments.boundary import (
    BoundarySpec,
    Side,
    SideTarget,
    measure,
    require_points,
    summarise,
)
from kvlab.experiments.cancel_step import cancel_restart
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.offload import measure_capacity, require_successes
from kvlab.experiments.pd_args import DISAGG_PARTS
from kvlab.experiments.pressure_plan import Counter, fit_preamble
from kvlab.experiments.procedure import CancelSpec
from kvlab.experiments.rounds import Rounds, for_pair
from kvlab.experiments.sizes import AllSpec
from kvlab.loadgen import CapacityAsk, LinkSpec, LoadSpec, run_load, topology
from kvlab.measure import kvmath, leg_bytes, workloads
from kvlab.observe import api_base
from kvlab.proxy import Balance, ProxyArgs, process_plan
from kvlab.records import (
    PROXY_LABEL,
    BoundaryPointRecord,
    LinkRecord,
    LoadRecord,
    PredictionRecord,
    Record,
    RunContext,
    Where,
    leg_of,
    notebook,
    rows,
)

LAB = notebook.LAB_PD
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"
STARTED_HERE = "kvlab run disagg started prefill, decode and proxy on this machine"
TOPOLOGY = topology.loopback_split("shared", STARTED_HERE)
BASELINE = topology.one_instance("http://127.0.0.1", "kvlab run disagg started the baseline "
                                 "on this machine")
TWO_MACHINES = (
    "needs two machines: PREFILL_HOST and DECODE_HOST name one machine each, and this run took "
    "the single-machine path (loopback). With a Ray cluster across the two, `kvlab run disagg "
    "--cluster ADDRESS` runs it (README, Two machines (Ray)); without one, run `kvlab serve "
    "prefill` and `kvlab serve decode` on the two machines, `kvlab proxy`, then `kvlab run-load "
    "disagg URL` and `kvlab compare`"
)
CLUSTER_CHECKS = ("each node holds its address, the engine and model paths exist on it, and "
                  "the store is one directory for every node that uses it (a probe file): "
                  "checked by the run's agents, before any engine starts")
NO_NIXL = (
    "needs NixlConnector between two machines over RDMA (CONNECTOR=nixl, SIDE_CHANNEL_ADDR on "
    "each); kvlab runs one machine here"
)
PARTS = DISAGG_PARTS
LOAD, CANCEL, BOUNDARY = PARTS
PREDICTED_PROMPTS = 8  # the prompts whose mean length the prediction takes
T = TypeVar("T")


@dataclass(frozen=True)
class Share:
    """Each engine's part of one device when the split and the baseline start together."""

    fraction: float
    cache_bytes: int


Given = dict[str, EngineProcess]  # engines started together, by startup label


@dataclass(frozen=True)
class DisaggSpec:
    levels: tuple[int, ...] = (1, 4, 8)
    requests: int | None = None  # None: the load generator's default per level
    max_tokens: int = 128
    preamble_tokens: int = 4096
    prompt_set: str = "shared-prefix"
    link_gbps: float | None = None
    parts: tuple[str, ...] = (LOAD,)
    cancel: CancelSpec = field(default_factory=CancelSpec)
    boundary: BoundarySpec = field(default_factory=BoundarySpec)
    capacity: CapacityAsk | None = None  # --part load: the highest request rate at a target
    repeat: int = 1  # --part load: each side's load this many times, in alternating order
    rule: repeats.Sequential | None = None  # --repeat auto: until settled, `repeat` the cap
    label: str = "disagg"  # the split's rows (the baseline's are `baseline`)
    balance: Balance = "round-robin"  # how the proxy picks among several prefills or decodes
    together: bool = False  # one round: the split and the baseline start at once (run all)

    def has(self, part: str) -> bool:
        return part in self.parts


def _settings(lab: Lab, store: str, share: Share | None = None) -> Settings:
    """CONNECTOR as set (shared by default; nixl and mooncake move the KV point to point,
    the store then unused), both roles on this machine's one device unless placed; with
    `share`, each engine's fraction of the device and its device cache."""
    update: dict[str, object] = {"single_machine": True, "kv_shared_path": store,
                                 "side_channel_addr": _side_channel(lab)}
    if share is not None:
        update |= {"split_mem_fraction": share.fraction, "kv_cache_bytes": share.cache_bytes}
    return lab.settings.model_copy(update=update)


def _side_channel(lab: Lab) -> str:
    """SIDE_CHANNEL_ADDR, or this machine's loopback for a point-to-point connector when it is
    unset (both roles here; on a cluster each node's own address replaces it)."""
    if _connector(lab).side_channel:
        return lab.settings.side_channel_addr or "127.0.0.1"
    return lab.settings.side_channel_addr


def _connector(lab: Lab) -> connectors.Connector:
    """The connector the split runs (CONNECTOR)."""
    return connectors.get(lab.settings.connector)


def _store(lab: Lab) -> KvStore:
    """The on-disk store of the split's connector (asked only where it keeps one)."""
    found = store_for(lab.settings.connector)
    if found is None:
        raise SettingError(f"CONNECTOR={lab.settings.connector} keeps no store on disk")
    return found


def transport(lab: Lab) -> str | None:
    """What carried the KV, as far as the environment forces it (NIXL's UCX_TLS)."""
    return _connector(lab).transport(dict(os.environ))


def split_plans(lab: Lab, store: str, share: Share | None = None) -> list[EnginePlan]:
    """The split's engines: one prefill per PREFILL_HOSTS node, then one decode per
    DECODE_HOSTS node (one of each without the lists, or on this machine)."""
    settings = _settings(lab, store, share)
    # the two cores shared out when the engines share a machine's (Ray nodes on one machine too)
    cpu = lab.install(VLLM).platform == "cpu" and (
        lab.cluster is None or lab.cluster.same_machine("prefill", "decode") is not False)
    out = []
    for i, role in enumerate(lab.placement.split_roles()):
        plan = lab.plan(VLLM, leg_of(role)[0], PlanRequest(
            port=free_port(), cpu_core=i % 2 if cpu else None, store_here=lab.survey is None),
            settings)
        out.append(replace(plan, role=role))
    return out


def sides(lab: Lab, plans: Sequence[T]) -> tuple[list[T], list[T]]:
    """The split's plans (or engines) as its prefills and its decodes."""
    prefills = lab.placement.counts()[0]
    return list(plans[:prefills]), list(plans[prefills:])


def proxy_plan(prefills: Sequence[EnginePlan], decodes: Sequence[EnginePlan],
               via: ConnectorName = "shared", balance: Balance = "round-robin",
               affinity: tuple[str, int] = ("", 0)) -> EnginePlan:
    """kvlab's proxy as its own process, so it never shares an event loop with the load;
    every leg given, each side balanced by `balance` (prefix affinity: `affinity` is the
    model's tokenizer and the engines' block size)."""
    args = ProxyArgs(prefill=tuple(p.base_url for p in prefills),
                     decode=tuple(d.base_url for d in decodes), connector=via, balance=balance)
    if balance == "prefix-affinity":
        args = args.model_copy(update={"tokenizer": affinity[0], "block_tokens": affinity[1]})
    return process_plan(args, prefills[0].model, prefills[0].served_name)


def split_proxy(lab: Lab, spec: DisaggSpec, plans: Sequence[EnginePlan]) -> EnginePlan:
    """The proxy in front of the split's `plans`, with the run's balance policy."""
    prefills, decodes = sides(lab, plans)
    block = engine_for(VLLM).block_size(lab.install(VLLM).platform)
    return proxy_plan(prefills, decodes, lab.settings.connector, spec.balance,
                      (lab.settings.small_model, block))


def baseline_plan(lab: Lab, store: str, share: Share | None = None) -> EnginePlan:
    return lab.plan(VLLM, "baseline", PlanRequest(port=free_port()),
                    _settings(lab, store, share))


def split_where(lab: Lab) -> Where:
    """The split's topology fields: loopback here, or as the cluster placed it."""
    if lab.cluster is None:
        where = topology.loopback_split(lab.settings.connector, STARTED_HERE)
    else:
        where = lab.cluster.split_topology(lab.settings.connector, "kvlab run disagg placed "
                                           "prefill and decode on Ray nodes (machine ids from "
                                           "their agents)")
    where.transport = transport(lab)
    return where


def baseline_where(lab: Lab) -> Where:
    if lab.cluster is None:
        return BASELINE
    return lab.cluster.instance_topology("baseline", "kvlab run disagg placed the baseline on "
                                         "a Ray node")


def _two_machines(lab: Lab) -> str | None:
    """Why the two-machine row is not run here (None: this run is that row)."""
    if lab.cluster is None:
        return TWO_MACHINES
    same = lab.cluster.same_machine("prefill", "decode")
    if same is False:
        return None
    p, d = lab.cluster.node_facts("prefill"), lab.cluster.node_facts("decode")
    if same is None:
        return (f"needs two machines known to be two: PREFILL_HOST's Ray node ({p.node}) "
                f"and DECODE_HOST's ({d.node}) have no machine id and different addresses, "
                "so whether they are one machine is unknown")
    return (f"needs two machines: PREFILL_HOST's Ray node ({p.node}) and DECODE_HOST's "
            f"({d.node}) are one machine (one machine id, or one address), so this run "
            "is two Ray nodes on one machine, recorded under the one-machine row")


def predict(lab: Lab, spec: DisaggSpec, block: int) -> PredictionRecord:
    """The lab's three numbers, recorded before any engine starts."""
    model = lab.settings.small_model
    # the run's own prompts: distinct ones (mixed) vary in length, so their mean
    prompts = workloads.build(spec.prompt_set, PREDICTED_PROMPTS,
                              preamble_tokens=spec.preamble_tokens)
    counter = Counter.of(model)  # as the server counts them: chat template included
    tokens = round(sum(counter.prompt(p) for p in prompts) / len(prompts))
    shape = kvmath.load_shape(Path(model)) if Path(model).exists() else None
    where = split_where(lab)
    gbps = spec.link_gbps or (where.link_speed_mbps or 0) / 1000  # the node's link speed
    link = kvmath.gbps_to_bytes_per_s(gbps) if gbps else None
    line = PredictionRecord(label=rows.prediction_label(spec.label), lab=LAB, model=model,
                            prompt_tokens=tokens)
    if shape is not None:
        line.overlay(kvmath.predict(shape, prompt_tokens=tokens, block_size=block,
                                    link_bytes_per_s=link))
    line.overlay(where)
    if link is None:
        line.ttft_prediction = (
            "worse at every concurrency on one device: the split adds a second prefill "
            "request, " + ("a store write and read" if _connector(lab).needs_store
                           else f"a {lab.settings.connector} transfer")
            + ", and a proxy hop, and no network can be faster than not moving the cache at "
            "all")
    return lab.record(line)


@dataclass
class _Measured:
    """What the engines' stints produced, for the steps after the engines are stopped, and
    the rounds they ran in."""

    rounds: Rounds = field(default_factory=lambda: Rounds(1))
    records: list[Record] = field(default_factory=list)
    sweeps: dict[str, list[LoadRecord]] = field(default_factory=dict)
    points: list[BoundaryPointRecord] = field(default_factory=list)
    prediction: PredictionRecord | None = None  # the per-leg bytes are set against it


def _checked(lab: Lab, spec: DisaggSpec) -> DisaggSpec:
    """The spec with the load's preamble fitted to CTX; refuses a step that cannot fit."""
    if lab.placement.counts() != (1, 1) and (spec.has(CANCEL) or spec.has(BOUNDARY)):
        raise SettingError(
            "--part cancel and --part boundary run on one prefill and one decode: list one "
            "node each in PREFILL_HOSTS and DECODE_HOSTS (or use PREFILL_HOST and DECODE_HOST) "
            "for them; --part load runs on every listed node")
    ctx = lab.settings.ctx
    spec = replace(spec, cancel=spec.cancel.resolved(ctx) if spec.has(CANCEL) else spec.cancel,
                   boundary=spec.boundary.resolved(ctx) if spec.has(BOUNDARY)
                   else spec.boundary)
    if not spec.has(LOAD):
        return spec
    fitted = fit_preamble(lab.settings.small_model, spec.prompt_set, spec.preamble_tokens,
                          spec.max_tokens, ctx)
    if fitted != spec.preamble_tokens:
        lab.say(f"    preamble {spec.preamble_tokens} -> {fitted} tokens to fit CTX "
                f"{ctx} with this model's tokenizer")
        spec = replace(spec, preamble_tokens=fitted)
    return spec


def _load_spec(lab: Lab, spec: DisaggSpec, label: str, url: str,
               where: Where, repeat: int | None = None) -> LoadSpec:
    settings = lab.settings
    context = RunContext(memory_fraction=settings.split_mem_fraction).overlay(where)
    return LoadSpec(base_url=api_base(url), model=settings.served_name, levels=spec.levels,
                    requests=spec.requests, max_tokens=spec.max_tokens,
                    prompt_set=spec.prompt_set, label=label, repeat=repeat,
                    preamble_tokens=spec.preamble_tokens, lab=LAB, context=context,
                    run_id=lab.run_id)


def _link_spec(lab: Lab, urls: tuple[str, ...], legs: dict[str, str], where: Where,
               store_path: str = "") -> LinkSpec:
    """The counters around a load: the split's (`legs` named) or the baseline's."""
    # this machine's counters: loopback, unless the cluster's nodes are other machines
    iface = LOOPBACK if where.link == topology.LOOPBACK else lab.settings.cluster_iface
    connector = _connector(lab) if legs else None
    via = connector.name if connector else connectors.NONE
    side = _side_channel(lab) if connector and connector.side_channel else ""
    shared = connector is not None and connector.needs_store
    return LinkSpec(connector=via, context_length=lab.settings.ctx, iface=iface,
                    metrics_urls=urls, store_path=store_path if shared else "",
                    drain_store=shared and lab.cluster is None,
                    side_channel_addr=side, where=where, legs=legs or None,
                    run_id=lab.run_id)


def _writer(lab: Lab, roles: tuple[str, ...], store: str = "",
            prediction: PredictionRecord | None = None) -> Callable[[Record], object]:
    """How the load's rows are written: the split's link row with each leg's figures; on a
    cluster, with each node's counters."""
    write = _with_legs(lab, lab.record, prediction)
    if lab.cluster is None:
        return write
    from kvlab.cluster.runner import NodeReader

    return NodeReader(lab.cluster.placed(roles), store).writer(write)


def _with_legs(lab: Lab, write: Callable[[Record], object],
               prediction: PredictionRecord | None) -> Callable[[Record], object]:
    """`write`, with a split's link row carrying each leg's requests and bytes."""
    def wrapped(line: Record) -> object:
        if isinstance(line, LinkRecord) and line.legs:
            nodes = {role: lab.cluster.node_facts(role).node if lab.cluster else None
                     for role in line.legs}
            line.per_leg = leg_bytes.per_leg(line, prediction, nodes)
            for leg in line.per_leg:
                lab.say("    " + leg_bytes.line(leg))
        return write(line)

    return wrapped


def store_writes(lab: Lab, spec: DisaggSpec) -> int:
    """The most entries the store holds at once (each request a distinct prompt: one entry):
    kvlab's generator removes them after each level (`LinkSpec.drain_store`), so the largest
    level's warm-up and measured requests; a LOAD_TEST file's sweep keeps every level's, every
    repeat's, and the proxy check's one. A capacity search removes its own after each probe
    (`_between_probes`)."""
    load = _load_spec(lab, spec, spec.label, "http://127.0.0.1", split_where(lab))
    levels = [load.floor(c) + load.warmup_for(c) for c in load.levels]
    if not lab.settings.load_test:
        return max(levels)
    return sum(levels) * spec.repeat + 1


def _require_room(lab: Lab, spec: DisaggSpec, store: Path,
                  prediction: PredictionRecord) -> None:
    """Before any engine starts: the store's filesystem holds every entry the split writes
    (CONNECTOR=shared only; a point-to-point connector writes none)."""
    per_token, tokens = prediction.bytes_per_token, prediction.prompt_tokens
    if not _connector(lab).needs_store or not per_token or not tokens or lab.cluster:
        return
    block = prediction.block_size or engine_for(VLLM).block_size(lab.install(VLLM).platform)
    room = _store(lab).require_room(store, store_writes(lab, spec),
                                    per_token * kvmath.round_up(tokens, block))
    held = ("" if lab.settings.load_test
            else ", the largest level's: each level's entries are removed after it")
    lab.say(f"    store room: {human_bytes(room.free_bytes)} free for about "
            f"{human_bytes(room.predicted_bytes)} ({room.requests} entries{held})")


async def _preflight(lab: Lab, spec: DisaggSpec, store: Path) -> None:
    """On a cluster, before anything starts: engines and models on their nodes, one store."""
    split = split_plans(lab, str(store))
    plans = [*split, split_proxy(lab, spec, split)]
    if spec.has(LOAD) or spec.has(BOUNDARY):
        plans.append(baseline_plan(lab, str(store)))
    await lab.preflight(plans, store, "prefill", lab.placement.split_roles()[1:])


def all_spec(lab: Lab, sizes: AllSpec) -> DisaggSpec:
    """The split at `kvlab run all`'s sizes: the load and the procedures, or the load alone
    on several prefills or decodes (XpYd), where the procedures do not run."""
    parts = DISAGG_PARTS if lab.placement.counts() == (1, 1) else DISAGG_PARTS[:1]
    return DisaggSpec(levels=sizes.levels, requests=sizes.requests,
                      max_tokens=sizes.max_tokens, preamble_tokens=sizes.preamble_tokens,
                      prompt_set=sizes.prompt_set, parts=parts, capacity=sizes.capacity,
                      together=sizes.together)


async def run(lab: Lab, spec: DisaggSpec) -> list[Record]:
    lab.install(VLLM).require()
    spec = _checked(lab, spec)
    out: list[Record] = []
    prediction = None
    store = lab.store("pd")
    got = _Measured(_rounds(lab, spec))
    try:
        await _preflight(lab, spec, store)
        if spec.has(LOAD):
            prediction = predict(lab, spec, engine_for(VLLM).block_size(lab.install(VLLM).platform))
            got.prediction = prediction
            out.append(prediction)
            _require_room(lab, spec, store, prediction)
            if (why := _two_machines(lab)) is not None:
                out.append(lab.not_run(rows.TWO_MACHINES_SHARED, why))
            out.append(lab.not_run(rows.TWO_MACHINES_NIXL, NO_NIXL))
        async with contextlib.AsyncExitStack() as stack:
            given = await _together(lab, spec, str(store), stack)
            for stint in got.rounds.stints():
                if stint.side == 0:
                    await _split_stint(lab, spec, store, got, stint, given)
                elif spec.has(LOAD) or spec.has(BOUNDARY):
                    await _baseline_stint(lab, spec, store, got, stint, given)
    finally:
        lab.cleanup()
    out += got.records
    if spec.has(BOUNDARY):
        out += summarise(lab, spec.boundary, got.points)
        require_points(got.points)
    if prediction is not None:
        out.append(_compare(lab, spec, got, prediction))
    return out


def _rounds(lab: Lab, spec: DisaggSpec) -> Rounds:
    """The pair's and the baseline's stints: `--repeat`'s, for the load (once without it)."""
    if not spec.has(LOAD):
        return Rounds(1)
    return for_pair(lab, spec.repeat, spec.rule, spec.label, "baseline")


async def _together(lab: Lab, spec: DisaggSpec, store: str,
                    stack: contextlib.AsyncExitStack) -> Given:
    """With one round (no repeats), the split's engines and the baseline started at once,
    each with an equal share of the device and the same device cache (the baseline and the
    split still differ in one thing); {} where they start apart (said, when it is the fit)."""
    if not spec.together or spec.repeat != 1 or spec.rule is not None:
        return {}
    roles = lab.placement.split_roles()
    model = Path(lab.settings.small_model)
    block = engine_for(VLLM).block_size(lab.install(VLLM).platform)
    cache = together.quiet_cache_bytes(lab, kvmath.load_shape(model).bytes_per_token(),
                                       block) if (model / "config.json").exists() else 0
    why = together.apart(lab, [cache] * (len(roles) + 1), str(model))
    if why is not None:
        lab.say(f"    note: the split and the baseline start one at a time: {why}")
        return {}
    share = Share(round(lab.settings.mem_fraction / (len(roles) + 1), 3), cache)
    labels = [f"{spec.label}-{r}" for r in roles]

    def plans() -> tuple[list[EnginePlan], list[str]]:
        return ([*split_plans(lab, store, share), baseline_plan(lab, store, share)],
                [*labels, "baseline"])

    return await together.start(lab, stack, [plans])


@contextlib.asynccontextmanager
async def _pair(lab: Lab, spec: DisaggSpec, store: Path,
                given: Given) -> AsyncIterator[list[EngineProcess]]:
    labels = [f"{spec.label}-{r}" for r in lab.placement.split_roles()]
    if given:
        yield [given[label] for label in labels]
        return
    async with engines(lab, split_plans(lab, str(store)), labels=labels) as pair:
        yield pair


async def _split_stint(lab: Lab, spec: DisaggSpec, store: Path, got: _Measured,
                       stint: repeats.Stint, given: Given) -> None:
    """The pair behind the proxy: the crossing check, the stint's load repeats, then (in
    the pair's first stint) each other part that needs the split."""
    from kvlab.proxy import crossing_check

    settings, where = lab.settings, split_where(lab)
    roles = lab.placement.split_roles()
    # the proxy starts once every leg is ready (it checks them as it starts); the legs' URLs
    # are the started plans' (on a cluster, their nodes' addresses)
    async with _pair(lab, spec, store, given) as pair, \
            engines(lab, [split_proxy(lab, spec, [e.plan for e in pair])],
                    labels=[PROXY_LABEL]) as (proxy,):
        prefills, decodes = sides(lab, [e.plan for e in pair])
        decode = decodes[0]
        if stint.first:
            crossing = await crossing_check(proxy.plan.base_url,
                                            [p.base_url for p in prefills],
                                            [d.base_url for d in decodes],
                                            settings.served_name, api_key=lab.api_key())
            got.records.append(lab.record(crossing.as_record(spec.label, LAB).overlay(where)))
            lab.say(f"==> proxy check: crossed={crossing.crossed} "
                    + "; ".join(crossing.reasons))
        if spec.has(LOAD):
            legs = {e.plan.role: e.plan.metrics_url for e in pair}
            link = _link_spec(lab, tuple(legs.values()), legs, where, str(store))
            await _loads(lab, spec, got, spec.label, proxy.plan.base_url, where, link,
                         roles, stint, str(store))
        if not stint.first:
            return
        if spec.has(BOUNDARY):
            await _boundary_side(lab, spec, got, proxy, decode.metrics_url, "split", where)
        if spec.has(CANCEL):  # last: it leaves decode restarted and then stopped
            got.records.append(await cancel_restart(lab, spec.cancel, pair, proxy))


async def _baseline_stint(lab: Lab, spec: DisaggSpec, store: Path, got: _Measured,
                          stint: repeats.Stint, given: Given) -> None:
    """The monolithic baseline, the one variable changed, for each part that compares."""
    where = baseline_where(lab)
    async with _baseline(lab, store, given) as engine:
        base = engine.plan
        if spec.has(LOAD):
            await _loads(lab, spec, got, "baseline", base.base_url, where,
                         _link_spec(lab, (base.metrics_url,), {}, where), ("baseline",),
                         stint)
        if stint.first and spec.has(BOUNDARY):
            await _boundary_side(lab, spec, got, engine, base.metrics_url, "baseline", where)


@contextlib.asynccontextmanager
async def _baseline(lab: Lab, store: Path, given: Given) -> AsyncIterator[EngineProcess]:
    if "baseline" in given:
        yield given["baseline"]
        return
    async with engines(lab, [baseline_plan(lab, str(store))], labels=["baseline"]) as (engine,):
        yield engine


async def _loads(lab: Lab, spec: DisaggSpec, got: _Measured, label: str, url: str,
                 where: Where, link: LinkSpec, roles: tuple[str, ...],
                 stint: repeats.Stint, store: str = "") -> None:
    """The stint's load repeats, each with the link's counters around it; then, in the
    side's first stint, its capacity at the target."""
    for repeat in stint.repeats:
        if repeat is not None:
            lab.say(f"==> {label}: {got.rounds.numbered(repeat)}")
        row_link, sweep = await run_load(
            _load_spec(lab, spec, label, url, where, repeat), link, lab.settings.labbook,
            got.rounds.writer(_writer(lab, roles, store, got.prediction)),
            api_key=lab.api_key())
        rows = sweep.rows if sweep else []
        got.sweeps.setdefault(label, []).extend(rows)
        got.records += [*rows, row_link]
    if stint.first and spec.capacity is not None:
        got.records.append(await measure_capacity(lab, spec.capacity, _load_spec(
            lab, spec, label, url, where), "rate", _between_probes(lab, store)))


def _between_probes(lab: Lab, store: str) -> Callable[[], object] | None:
    """A capacity search sends as many requests as it takes, more than the store-room check
    counts (on the H200 one filled a 64 GiB disk and stopped prefill): with the shared
    directory, the store's entries are removed before the search and after each probe. No
    later request reads them (each request's entry is its own prompt's, read by decode as
    the request crosses), so the disk holds one probe's writes."""
    if not _connector(lab).needs_store or not store or lab.cluster is not None:
        return None
    path = Path(store)
    drain = _store(lab).drain
    removed = drain(path)[0]
    lab.say(f"    store: {removed} entries of the load removed before the capacity search; "
            "each probe's are removed after it")
    return partial(drain, path)


async def _boundary_side(lab: Lab, spec: DisaggSpec, got: _Measured, front: EngineProcess,
                         metrics_url: str, side: Side, where: Where) -> None:
    target = SideTarget(side, front.plan.base_url, metrics_url, where)
    points = await measure(lab, spec.boundary, target, lab.settings.small_model)
    got.points += points
    got.records += points


def _compare(lab: Lab, spec: DisaggSpec, got: _Measured,
             prediction: PredictionRecord) -> Record:
    from kvlab.measure import compare_runs

    require_successes(spec.label, got.sweeps.get(spec.label, []))
    require_successes("baseline", got.sweeps.get("baseline", []))
    labbook = lab.settings.labbook
    where = split_where(lab)
    result = compare_runs(notebook.read(labbook).records, labbook, spec.label, "baseline",
                     kv_bytes_per_token=prediction.bytes_per_token,
                     prompt_tokens=prediction.prompt_tokens, note=where.link or "")
    line = result.record.overlay(where)
    rate = prediction.link_bytes_per_s
    if prediction.transfer_s and rate:
        line.transfer_predicted_s = prediction.transfer_s
        line.link_gbps_predicted = round(rate * 8 / 1e9, 3)
    lab.record(line)
    for text in result.lines:
        lab.say(text)
    return line


def dry_run(lab: Lab, spec: DisaggSpec) -> list[dict[str, object]]:
    import tempfile

    # the steps' sizes are refused as a run would refuse them (the load's preamble is fitted
    # with the model's tokenizer only when it runs)
    _checked(lab, replace(spec, parts=tuple(p for p in spec.parts if p != LOAD)))
    # the decode plan checks that its store exists; a run makes a fresh one in KVLAB_HOME/stores
    # (on a cluster, inside KV_SHARED_PATH on the nodes: named, not made)
    with tempfile.TemporaryDirectory(prefix="kvlab-store-") as scratch:
        store = str(lab.store_path("pd")) if lab.survey else scratch
        split = [_on_node(lab, p) for p in split_plans(lab, store)]
        plans = [*split, _on_node(lab, split_proxy(lab, spec, split))]
        if spec.has(LOAD) or spec.has(BOUNDARY):
            plans.append(_on_node(lab, baseline_plan(lab, store)))
    out: list[dict[str, object]] = [] if lab.survey is None else [_placement(lab, plans, store)]
    out += [{"label": p.role, "plan": p.as_dict(), "shell": p.shell_line(),
             **_node(lab, p.role)} for p in plans]
    if spec.has(LOAD):
        out += [{"label": "disagg-two-machines", "reason": TWO_MACHINES},
                {"label": "disagg-nixl", "reason": NO_NIXL}]
    return out


def _on_node(lab: Lab, plan: EnginePlan) -> EnginePlan:
    """A dry run's plan as the cluster run would start it: on its node's address (its port
    is one free there, chosen when it starts)."""
    found = lab.survey.where(plan.role) if lab.survey else None
    return on_node(plan, found.bind, plan.port) if found else plan


def _node(lab: Lab, role: str) -> dict[str, str]:
    """Which node a dry run's plan would go to (none: where kvlab runs)."""
    if lab.survey is None:
        return {}
    return {"node": lab.survey.role(role, "").node}


def _placement(lab: Lab, plans: list[EnginePlan], store: str) -> dict[str, object]:
    """A cluster dry run's placement: each role's node and URL (the proxy's too), the store
    and the nodes that would read it."""
    survey = lab.survey
    assert survey is not None
    shared = _connector(lab).needs_store
    sides = list(dict.fromkeys(survey.role(r, "").node for r in lab.placement.split_roles()))
    if not shared:
        store_from = f"CONNECTOR={lab.settings.connector}: the KV goes point to point"
    elif lab.settings.kv_shared_path:
        store_from = "a directory of the run's own inside KV_SHARED_PATH"
    else:
        store_from = "KV_SHARED_PATH unset: KVLAB_HOME's stores, which two machines do not share"
    return {"label": "placement", "placement": DryPlacement(
        cluster=survey.placement.cluster, origin=survey.placement.origin,
        roles=[survey.role(p.role, p.base_url) for p in plans],
        store=store if shared else None, store_seen_by=sides if shared else [],
        store_from=store_from, nodes=survey.listing(), left_to_the_run=CLUSTER_CHECKS)}
