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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from kvlab.core import SettingError, api_base, connectors, human_bytes
from kvlab.engines import (
    VLLM,
    EnginePlan,
    EngineProcess,
    engine_for,
)
from kvlab.experiments import repeats, together
from kvlab.experiments.boundary import (
    Side,
    SideTarget,
    measure,
    require_points,
    summarise,
)
from kvlab.experiments.cancel_step import cancel_restart
from kvlab.experiments.disagg_spec import BOUNDARY, CANCEL, DISAGG_PARTS, LOAD, DisaggSpec
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.offload import measure_capacity, require_successes
from kvlab.experiments.pressure_plan import Counter, fit_preamble
from kvlab.experiments.rounds import Rounds, for_pair
from kvlab.experiments.sizes import AllSpec
from kvlab.experiments.split import (
    LOOPBACK,
    NO_NIXL,
    TWO_MACHINES,
    apart_memory,
    baseline_plan,
    baseline_where,
    dry_placement,
    node_of,
    on_its_node,
    side_channel,
    sides,
    split_connector,
    split_memory,
    split_plans,
    split_proxy,
    split_store,
    split_where,
    two_machines,
)
from kvlab.loadgen import LinkSpec, LoadSpec, run_load, topology, workloads
from kvlab.measure import kvmath, leg_bytes
from kvlab.records import (
    PROXY_LABEL,
    BoundaryPointRecord,
    LinkRecord,
    LoadRecord,
    PredictionRecord,
    Record,
    RunContext,
    Where,
    notebook,
    rows,
)

LAB = notebook.LAB_PD
PARTS = DISAGG_PARTS
PREDICTED_PROMPTS = 8  # the prompts whose mean length the prediction takes


Given = dict[str, EngineProcess]  # engines started together, by startup label


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
            "request, " + ("a store write and read" if split_connector(lab).needs_store
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
    connector = split_connector(lab) if legs else None
    via = connector.name if connector else connectors.NONE
    side = side_channel(lab) if connector and connector.side_channel else ""
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
    if not split_connector(lab).needs_store or not per_token or not tokens or lab.cluster:
        return
    block = prediction.block_size or engine_for(VLLM).block_size(lab.install(VLLM).platform)
    room = split_store(lab).require_room(store, store_writes(lab, spec),
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
            if (why := two_machines(lab)) is not None:
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
    memory = split_memory(lab, at_once=True)
    if memory.start != "together":
        lab.say(f"    note: the split and the baseline start one at a time: {memory.why}")
        return {}
    labels = [f"{spec.label}-{r}" for r in lab.placement.split_roles()]

    def plans() -> tuple[list[EnginePlan], list[str]]:
        return ([*split_plans(lab, store, memory), baseline_plan(lab, store, memory)],
                [*labels, "baseline"])

    return await together.start(lab, stack, [plans], memory)


@contextlib.asynccontextmanager
async def _pair(lab: Lab, spec: DisaggSpec, store: Path,
                given: Given) -> AsyncIterator[list[EngineProcess]]:
    labels = [f"{spec.label}-{r}" for r in lab.placement.split_roles()]
    if given:
        yield [given[label] for label in labels]
        return
    memory = apart_memory(lab)
    async with together.held(lab, split_plans(lab, str(store), memory), labels,
                             memory) as pair:
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
    plan = baseline_plan(lab, str(store), apart_memory(lab))
    async with engines(lab, [plan], labels=["baseline"]) as (engine,):
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
            lab, spec, label, url, where), "rate", _between_probes(lab, store),
            got.sweeps.get(label, [])))


def _between_probes(lab: Lab, store: str) -> Callable[[], object] | None:
    """A capacity search sends as many requests as it takes, more than the store-room check
    counts (on the H200 one filled a 64 GiB disk and stopped prefill): with the shared
    directory, the store's entries are removed before the search and after each probe. No
    later request reads them (each request's entry is its own prompt's, read by decode as
    the request crosses), so the disk holds one probe's writes."""
    if not split_connector(lab).needs_store or not store or lab.cluster is not None:
        return None
    path = Path(store)
    drain = split_store(lab).drain
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
        split = [on_its_node(lab, p) for p in split_plans(lab, store)]
        plans = [*split, on_its_node(lab, split_proxy(lab, spec, split))]
        if spec.has(LOAD) or spec.has(BOUNDARY):
            plans.append(on_its_node(lab, baseline_plan(lab, store)))
    out: list[dict[str, object]] = [] if lab.survey is None else [dry_placement(lab, plans, store)]
    out += [{"label": p.role, "plan": p.as_dict(), "shell": p.shell_line(),
             **node_of(lab, p.role)} for p in plans]
    if spec.has(LOAD):
        out += [{"label": rows.TWO_MACHINES_SHARED.label, "reason": TWO_MACHINES},
                {"label": rows.TWO_MACHINES_NIXL.label, "reason": NO_NIXL}]
    return out


