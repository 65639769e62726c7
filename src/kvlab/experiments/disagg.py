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
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvlab.core.settings import Settings
from kvlab.engines import vllm
from kvlab.engines.base import VLLM, engine_for
from kvlab.engines.plan import EnginePlan, Flag
from kvlab.engines.process import free_port
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.offload import require_successes
from kvlab.experiments.pressure import count_tokens, fit_preamble
from kvlab.measure import kvmath, workloads
from kvlab.measure.chat import api_base
from kvlab.records import notebook
from kvlab.records.models import CrossingRecord, PredictionRecord, Record

LAB = notebook.LAB_PD
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"
TOPOLOGY = {"topology": "loopback", "single_machine": True, "link": "loopback"}
TWO_MACHINES = (
    "needs two machines: PREFILL_HOST and DECODE_HOST name one machine each, and kvlab runs "
    "one machine's engines; this run took the single-machine path (loopback). Run `kvlab serve "
    "prefill` and `kvlab serve decode` on the two machines, `kvlab proxy`, then `kvlab run-load "
    "disagg URL` and `kvlab compare`"
)
NO_NIXL = (
    "needs NixlConnector between two machines over RDMA (CONNECTOR=nixl, SIDE_CHANNEL_ADDR on "
    "each); kvlab runs one machine here"
)


@dataclass(frozen=True)
class DisaggSpec:
    levels: tuple[int, ...] = (1, 4, 8)
    requests: int = 24
    max_tokens: int = 128
    preamble_tokens: int = 4096
    prompt_set: str = "shared-prefix"
    link_gbps: float | None = None


def _settings(lab: Lab, store: str) -> Settings:
    return lab.settings.model_copy(update={"single_machine": True, "connector": "shared",
                                           "kv_shared_path": store})


def pair_plans(lab: Lab, store: str) -> list[EnginePlan]:
    settings, install = _settings(lab, store), lab.vllm
    cpu = install.platform == "cpu"
    return [vllm.plan(settings, role, install, vllm.PlanOptions(
        port=free_port(), cpu_core=core if cpu else None))
        for role, core in (("prefill", 0), ("decode", 1))]


def proxy_plan(prefill: EnginePlan, decode: EnginePlan) -> EnginePlan:
    """kvlab's proxy as its own process, so it never shares an event loop with the load."""
    port = free_port()
    return EnginePlan(
        engine="kvlab-proxy", role="proxy", command=(sys.executable, "-m", "kvlab", "proxy"),
        flags=(Flag("--prefill", prefill.base_url), Flag("--decode", decode.base_url),
               Flag("--port", str(port)), Flag("--host", "127.0.0.1"),
               Flag("--connector", "shared")),
        host="127.0.0.1", port=port, health_path="/health", label_hint="disagg-proxy",
        model=prefill.model, served_name=prefill.served_name)


def baseline_plan(lab: Lab, store: str) -> EnginePlan:
    return vllm.plan(_settings(lab, store), "baseline", lab.vllm,
                     vllm.PlanOptions(port=free_port()))


def predict(lab: Lab, spec: DisaggSpec, block: int) -> PredictionRecord:
    """The lab's three numbers, recorded before any engine starts."""
    model = lab.settings.small_model
    prompt = workloads.build("shared-prefix", 1, preamble_tokens=spec.preamble_tokens)[0]
    tokens = count_tokens(model, prompt.as_text())
    shape = kvmath.load_shape(Path(model)) if Path(model).exists() else None
    link = kvmath.gbps_to_bytes_per_s(spec.link_gbps) if spec.link_gbps else None
    fields: dict[str, Any] = {"model": model, "prompt_tokens": tokens, **TOPOLOGY}
    if shape is not None:
        fields |= kvmath.predict(shape, prompt_tokens=tokens, block_size=block,
                                 link_bytes_per_s=link).as_dict()
    if link is None:
        fields["ttft_prediction"] = (
            "worse at every concurrency on one device: the split adds a second prefill "
            "request, a store write and read, and a proxy hop, and no network can be faster "
            "than not moving the cache at all")
    line = PredictionRecord(label="prediction", lab=LAB, **fields)
    return lab.record(line)


async def run(lab: Lab, spec: DisaggSpec) -> list[Record]:
    from kvlab.loadgen.linkrun import LinkSpec, run_load
    from kvlab.loadgen.sweep import LoadSpec
    from kvlab.proxy.check import crossing_check
    from kvlab.report.compare import compare

    vllm.require_found(lab.vllm)
    block = engine_for(VLLM).block_size(lab.vllm.platform)
    fitted = fit_preamble(lab.settings.small_model, spec.prompt_set, spec.preamble_tokens,
                          spec.max_tokens, lab.settings.ctx)
    if fitted != spec.preamble_tokens:
        lab.say(f"    preamble {spec.preamble_tokens} -> {fitted} tokens to fit CTX "
                f"{lab.settings.ctx} with this model's tokenizer")
        spec = replace(spec, preamble_tokens=fitted)
    prediction = predict(lab, spec, block)
    out: list[Record] = [prediction]
    out.append(lab.not_run(LAB, "disagg-two-machines",
                           "Two machines, shared-directory connector", TWO_MACHINES))
    out.append(lab.not_run(LAB, "disagg-nixl", "Two machines, NixlConnector", NO_NIXL))
    store = lab.store("pd")
    settings = lab.settings
    prefill, decode = pair_plans(lab, str(store))

    def load(label: str, url: str) -> LoadSpec:
        return LoadSpec(base_url=api_base(url), model=settings.served_name, levels=spec.levels,
                        requests=spec.requests, max_tokens=spec.max_tokens,
                        prompt_set=spec.prompt_set, label=label,
                        preamble_tokens=spec.preamble_tokens, lab=LAB,
                        extra={**TOPOLOGY, "run_id": lab.run_id,
                               "memory_fraction": settings.split_mem_fraction})

    def link(urls: tuple[str, ...], legs: dict[str, str], store_path: str = "") -> LinkSpec:
        return LinkSpec(connector="shared", context_length=settings.ctx, iface=LOOPBACK,
                        metrics_urls=urls, store_path=store_path,
                        extra={**TOPOLOGY, "run_id": lab.run_id, "legs": legs})

    try:
        # the proxy starts once both legs are ready (it checks them as it starts)
        async with engines(lab, [prefill, decode], labels=["disagg-prefill", "disagg-decode"]), \
                engines(lab, [proxy_plan(prefill, decode)]) as (proxy,):
            crossing = await crossing_check(proxy.plan.base_url, [prefill.base_url],
                                            [decode.base_url], settings.served_name,
                                            api_key=settings.api_key())
            out.append(lab.record(CrossingRecord(
                label="disagg", lab=LAB, **crossing.as_dict(), **TOPOLOGY)))
            lab.say(f"==> proxy check: crossed={crossing.crossed} "
                    + "; ".join(crossing.reasons))
            row_link, sweep = await run_load(
                load("disagg", proxy.plan.base_url),
                link((prefill.metrics_url, decode.metrics_url),
                     {"prefill": prefill.metrics_url, "decode": decode.metrics_url},
                     str(store)),
                settings.labbook, lab.record,
                api_key=settings.api_key())
        out += [*(sweep.rows if sweep else []), row_link]
        base = baseline_plan(lab, str(store))
        async with engines(lab, [base], labels=["baseline"]):
            row_link_b, sweep_b = await run_load(
                load("baseline", base.base_url), link((base.metrics_url,), {}), settings.labbook,
                lab.record, api_key=settings.api_key())
        out += [*(sweep_b.rows if sweep_b else []), row_link_b]
    finally:
        lab.cleanup()
    require_successes("disagg", sweep.rows if sweep else [])
    require_successes("baseline", sweep_b.rows if sweep_b else [])
    records = notebook.read(settings.labbook).records
    result = compare(records, settings.labbook, "disagg", "baseline",
                     kv_bytes_per_token=prediction.get("bytes_per_token"),
                     prompt_tokens=prediction.get("prompt_tokens"), note="loopback")
    out.append(lab.record(result.record.with_fields(**TOPOLOGY)))
    for line in result.lines:
        lab.say(line)
    return out


def dry_run(lab: Lab, spec: DisaggSpec) -> list[dict[str, Any]]:
    import tempfile

    # the decode plan checks that its store exists; a run makes a fresh one in KVLAB_HOME/stores
    with tempfile.TemporaryDirectory(prefix="kvlab-store-") as store:
        prefill, decode = pair_plans(lab, store)
        plans = [prefill, decode, proxy_plan(prefill, decode), baseline_plan(lab, store)]
    return [{"label": p.role, "plan": p.as_dict(), "shell": p.shell_line()} for p in plans] + [
        {"label": "disagg-two-machines", "reason": TWO_MACHINES},
        {"label": "disagg-nixl", "reason": NO_NIXL}]
