"""The seed's run-load.sh as a library call: a load run with the link's byte counters around it.

Around one sweep: CLUSTER_IFACE's byte counters (psutil), every RDMA port's counters (sysfs;
RDMA never shows in an interface's counters), and the engines' /metrics (prefix and external
hits, `vllm:nixl_bytes_transferred` when the decode side exports it). The sweep is the file
LOAD_TEST names when that setting is set (run as the seed runs it, `python3 FILE ...`), and
kvlab's own generator in-process otherwise. The result is one `link` record with the seed's
fields (lab, record, label, base_url, connector, context_length, prompt_set, concurrency as
the seed's comma string, requests, iface, wall_s, rx_bytes, tx_bytes, recorded_at) and
kvlab's additions. With a side-channel address (NIXL, Mooncake) every interface's bytes are
read too, and `sidechannel.check` says which network the run crossed. What the bytes mean for
the cache is `compare`'s business.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from kvlab.core import InputError, store_size
from kvlab.engines import evidence_deltas, store_for, transfer_deltas
from kvlab.loadgen import instances, sidechannel, topology
from kvlab.loadgen.sweep import LoadSpec, ProgressHook, SweepResult, run_sweep
from kvlab.observe import metrics, netdev
from kvlab.records import LinkRecord, LoadRecord, NixlCounters, Record, Where, notebook


@dataclass(frozen=True)
class LinkSpec:
    """What a link record states beyond the load spec (from settings, as the seed's .env)."""

    connector: str
    context_length: int
    iface: str
    load_test: str = ""  # a file run as LOAD_TEST; empty = kvlab's generator in-process
    metrics_urls: tuple[str, ...] = ()  # engines to scrape; empty = the base URL's server
    store_path: str = ""  # a shared-directory connector's store: its growth is the transfer
    drain_store: bool = False  # remove the store's entries after each level, counting their bytes
    side_channel_addr: str = ""  # NIXL/Mooncake: check which interface carried the run
    where: Where | None = None  # where the engines ran, when the caller placed them
    legs: dict[str, str] | None = None  # the proxy's upstreams by role
    run_id: str | None = None

    @property
    def drains(self) -> bool:
        return self.drain_store and bool(self.store_path)


@dataclass
class Readings:
    iface: netdev.IfaceCounters | None
    rdma: dict[str, netdev.RdmaPort]
    snapshots: dict[str, metrics.Snapshot | None]
    store_bytes: int | None = None
    every_iface: dict[str, netdev.IfaceCounters] = field(default_factory=dict)


@dataclass
class Drained:
    """Bytes of store entries removed during a run: the store's growth counts them."""

    bytes: int = 0


async def _read(spec: LinkSpec, urls: tuple[str, ...], client: httpx.AsyncClient,
                drained: Drained) -> Readings:
    snaps = {url: await metrics.scrape(client, url) for url in urls}
    size = await asyncio.to_thread(store_size, spec.store_path)
    if size is not None:
        size += drained.bytes
    every = netdev.read_all() if spec.side_channel_addr else {}
    return Readings(netdev.read_iface(spec.iface), netdev.read_rdma(), snaps, size, every)


def _drain(connector: str, store_path: str) -> int:
    """Remove the entries of the connector's store; their bytes (none without a store)."""
    store = store_for(connector)
    return store.drain(Path(store_path).expanduser())[1] if store is not None else 0


def _draining(spec: LinkSpec, write: Callable[[Record], object],
              drained: Drained) -> Callable[[Record], object]:
    """`write`, and with `drain_store` the store's entries removed once each level's row is
    written (its requests have all crossed), their bytes kept for the store's growth: the disk
    holds one level's writes, not the sweep's."""
    if not spec.drains:
        return write

    def wrapped(row: Record) -> object:
        out = write(row)
        if isinstance(row, LoadRecord):
            drained.bytes += _drain(spec.connector, spec.store_path)
        return out

    return wrapped


def load_test_argv(load_test: str, load: LoadSpec, labbook: str) -> list[str]:
    """The seed's exact command line for LOAD_TEST (run-load.sh passes these and only these)."""
    python = shutil.which("python3")
    if python is None:
        raise InputError("python3 is not on PATH; LOAD_TEST is run with python3")
    return [python, load_test, "--base-url", load.base_url, "--model", load.model,
            "--concurrency", ",".join(str(c) for c in load.levels),
            "--requests", str(load.requests or max(load.floor(c) for c in load.levels)),
            "--max-tokens", str(load.max_tokens),
            "--prompt-set", load.prompt_set, "--label", load.label, "--engine", "vllm",
            "--labbook", labbook]


def check_load_test(load_test: str) -> Path:
    """The LOAD_TEST file, or a one-line error naming the setting."""
    path = Path(load_test).expanduser()
    if not path.is_file():
        raise InputError(f"LOAD_TEST={load_test!r} does not point at a file; set it to Part 9's "
                         "load-test.py, or leave it empty to use kvlab's generator")
    return path


async def _run_load_test(load_test: str, load: LoadSpec, labbook: str) -> None:
    path = check_load_test(load_test)
    proc = await asyncio.create_subprocess_exec(*load_test_argv(str(path), load, labbook))
    try:
        code = await proc.wait()
    except asyncio.CancelledError:
        proc.terminate()
        await proc.wait()
        raise
    if code != 0:
        raise InputError(f"LOAD_TEST {path} exited with status {code}; no link line written")


def link_record(load: LoadSpec, spec: LinkSpec, before: Readings, after: Readings,
                wall_s: float, sweep: SweepResult | None) -> LinkRecord:
    """The `link` record: the seed's fields first, then kvlab's."""
    counters = netdev.iface_delta(before.iface, after.iface)
    deltas = {url: evidence_deltas(before.snapshots[url], after.snapshots[url])
              for url in after.snapshots}
    nixl = {url: NixlCounters.model_validate(v) for url in after.snapshots
            if (v := transfer_deltas(before.snapshots[url], after.snapshots[url]))}
    rdma = netdev.rdma_delta(before.rdma, after.rdma)
    link = LinkRecord(
        label=load.label, lab=notebook.LAB_PD, run_id=spec.run_id, base_url=load.base_url,
        connector=spec.connector, context_length=spec.context_length,
        prompt_set=load.prompt_set, concurrency=",".join(str(c) for c in load.levels),
        requests=load.requests if load.requests is not None
        else max(load.floor(c) for c in load.levels),
        iface=spec.iface, wall_s=round(wall_s, 3), rx_bytes=counters[0], tx_bytes=counters[1],
        rdma=rdma, metric_deltas=deltas, nixl=nixl or None,
        store_bytes=(after.store_bytes - before.store_bytes
                     if after.store_bytes is not None and before.store_bytes is not None
                     else None),
        model=load.model, max_tokens=load.max_tokens,
        load_generator=spec.load_test or "kvlab", repeat=load.repeat, legs=spec.legs,
        engines=load.context.engines)
    link.overlay(topology.unknown(load.base_url, spec.connector))
    if spec.where is not None:
        link.overlay(spec.where)
        link.connector = spec.connector  # run-load.sh writes CONNECTOR, the run's declared one
    if load.context.engines and load.context.connector not in (None, topology.UNKNOWN):
        link.connector = load.context.connector  # what the engines ran, not the setting
    if spec.side_channel_addr:
        link.side_channel = sidechannel.check(
            spec.side_channel_addr, spec.iface,
            netdev.all_deltas(before.every_iface, after.every_iface),
            rdma.rx_bytes + rdma.tx_bytes if rdma else None)
    if sweep is not None:
        link.requests_sent = sum(r.requests for r in sweep.rows)
        link.requests_ok = sum(r.ok or 0 for r in sweep.rows)
        link.requests_failed = sum(r.failed or 0 for r in sweep.rows)
        link.interrupted = sweep.interrupted or None
    return link


async def run_load(load: LoadSpec, spec: LinkSpec, labbook: str,
                   write: Callable[[Record], object], *, api_key: str = "",
                   stop: asyncio.Event | None = None, progress: ProgressHook | None = None,
                   ) -> tuple[LinkRecord, SweepResult | None]:
    """Counters, sweep, counters; appends the rows and the link record to `labbook` (each
    level's per-request file goes beside it)."""
    netdev.require_iface(spec.iface)
    if not load.labbook:
        load = replace(load, labbook=labbook)
    load = await instances.with_engines(load, api_key)
    urls = spec.metrics_urls or (metrics.metrics_url(load.base_url),)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    drained = Drained()
    if spec.drains:
        await asyncio.to_thread(_drain, spec.connector, spec.store_path)
    async with httpx.AsyncClient(timeout=10.0, trust_env=False, headers=headers) as client:
        before = await _read(spec, urls, client, drained)
        started = time.monotonic()
        sweep: SweepResult | None = None
        if spec.load_test:
            await _run_load_test(spec.load_test, load, labbook)
        else:
            sweep = await run_sweep(load, api_key=api_key, stop=stop, progress=progress,
                                    on_row=_draining(spec, write, drained))
        wall = time.monotonic() - started
        after = await _read(spec, urls, client, drained)
    record = link_record(load, spec, before, after, wall, sweep)
    write(record)
    return record, sweep
