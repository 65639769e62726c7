#!/usr/bin/env python3
"""Proxy overhead: kvlab's P/D proxy against the anchors, in one run, as ratios.

Setup (all on loopback): two synthetic upstreams (`synthetic_upstream.py`: first token after
--ttft-ms, then one every --itl-ms, every chunk stamped with the server's monotonic send
time), one as prefill and one as decode. Targets, each measured at every concurrency level:
  direct   the client straight to decode (the baseline; no prefill leg)
  kvlab    `kvlab proxy` (its own processes, uvloop; --kvlab-workers, 2 as by default)
  router   vllm-router from PyPI (Rust), if found (--router-bin; its own venv, not kvlab's)
  demo     vLLM's examples/.../disagg_proxy_demo.py, if given (--demo FILE, --demo-python)

Per request through a proxy (definitions in shared/BENCHMARKS.md):
  overhead = client TTFT - decode's own time to first chunk (server stamps)
             - prefill's own service time (server stamps, matched by X-Request-Id when the
               proxy forwards it, else that level's median) - the direct run's median
             client-side residual at the same concurrency
so the upstreams' own lateness under load is not charged to the proxy. Also: streamed
chunks per second (client side), proxy CPU per request (psutil, process + children, so
every kvlab worker), and
failures (status != 200 or fewer chunks than asked). The client is a raw asyncio.Protocol +
httptools one on uvloop, callback-driven, so it is not the bottleneck it measures.

  .venv/bin/python benchmarks/proxy_overhead.py --quick
  .venv/bin/python benchmarks/proxy_overhead.py --json-out /tmp/proxy.json
  .venv/bin/python benchmarks/proxy_overhead.py --levels 1,64,256 --repeat 5 \
      --targets kvlab,router    # 5 passes, order alternating, medians and spreads
  .venv/bin/python benchmarks/proxy_overhead.py --legs 8 --kvlab-balance prefix-affinity \
      --router-policy cache_aware --targets kvlab,router --levels 64,256
(16 legs: 8 prefill and 8 decode upstreams; every request carries the same prompt, one hot
prefix, so both routers' affinity meets its load bound: kvlab's --load-factor, vllm-router's
--balance-abs-threshold 64 / --balance-rel-threshold 1.5)
  .venv/bin/python benchmarks/proxy_overhead.py --legs 8 --kvlab-balance prefix-affinity \
      --router-policy cache_aware --targets kvlab,router --levels 64,256 --prefix-groups 32
(many prefixes: 32 groups, each request a group's own ~200-token opening and its question, so
both routers spread them; each prints its prefill legs' hit share, the requests whose group
their leg had already seen in the level)
The machine's load average is printed with the figures: on a busy machine they are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httptools
import psutil

HERE = Path(__file__).resolve().parent
now_ns = time.perf_counter_ns
_ARR = re.compile(rb'"srv_arr_ns":(\d+)')
_SRV = re.compile(rb'"srv_ns":(\d+)')
# where the anchors live by default: their own venv and the demo file, outside the repository
ANCHORS = str(Path(os.environ.get("TMPDIR") or "/tmp") / "kvlab-anchors")  # noqa: S108
PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)
WORDS = ("amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "iris", "jade",
         "kelp", "lilac", "maple", "nectar", "opal", "pine", "quartz", "reed", "sage", "tide")


def group_of(n: int, groups: int) -> int:
    """The prefix group of request n (seeded by n: the same in every pass and target)."""
    return random.Random(n).randrange(groups)


def preamble(group: int) -> str:
    """A group's own opening, about 200 tokens, different from its first word on."""
    rng = random.Random(f"group-{group}")
    return f"group {group}: " + " ".join(rng.choice(WORDS) for _ in range(200))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the load client ----------------------------------------------------------------------
@dataclass
class Record:
    rid: str
    sent: int
    first: int = 0
    end: int = 0
    status: int = 0
    chunks: int = 0
    srv_arr: int = 0
    srv_first: int = 0


class Worker(asyncio.Protocol):
    """One keep-alive connection sending requests back to back, driven by callbacks."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.rec: Record | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.rec is not None:
            self.rec.end = now_ns()
            self.run.finish(self, self.rec, ok=False)
            self.rec = None
        self.transport = None

    def on_body(self, body: bytes) -> None:
        if self.rec is not None and not self.rec.first:
            self.rec.first = now_ns()
        self.body.append(body)

    def on_message_complete(self) -> None:
        rec, self.rec = self.rec, None
        if rec is None:
            return
        rec.end = now_ns()
        rec.status = self.parser.get_status_code()
        raw = b"".join(self.body)
        self.body = []
        rec.chunks = raw.count(b'"srv_i"')
        head = raw[:800]
        if (a := _ARR.search(head)) and (s := _SRV.search(head)):
            rec.srv_arr, rec.srv_first = int(a.group(1)), int(s.group(1))
        self.run.finish(self, rec, ok=rec.status == 200)

    def send(self, rid: str, data: bytes) -> None:
        assert self.transport is not None
        self.rec = Record(rid, now_ns())
        self.transport.write(data)


class Run:
    """N requests over C connections; `wait()` returns the records.

    The connections' first requests are spread over `spread_s` (about one request's length),
    so the level starts in its steady state instead of with all C requests in one burst,
    whose queue would be the client's doing, not the proxy's (`--burst-start` keeps it).
    """

    def __init__(self, path: str, tokens: int, label: str, spread_s: float,
                 groups: int = 0) -> None:
        self.path, self.tokens, self.label = path, tokens, label
        self.groups = groups  # prefix groups (0: every request the one PROMPT)
        self.spread_s = spread_s
        self.left = 0
        self.n = 0
        self.records: list[Record] = []
        self.done: asyncio.Future[None] | None = None
        self.workers: list[Worker] = []
        self.active = 0

    def request(self, rid: str, prompt: str = PROMPT) -> bytes:
        body = json.dumps({"model": "fake-model", "prompt": prompt, "max_tokens": self.tokens,
                           "stream": True}).encode()
        # x-kvlab-timeline: as kvlab's load generator asks (kvlab's proxy then appends its
        # timeline after the answer; the other proxies ignore the header)
        return (b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nx-request-id: %s\r\nx-kvlab-timeline: 1\r\n"
                b"\r\n%s" % (
                    self.path.encode(), len(body), rid.encode(), body))

    async def connect(self, port: int, c: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(c):
            _, worker = await loop.create_connection(lambda: Worker(self), "127.0.0.1", port)
            self.workers.append(worker)

    async def go(self, n: int) -> list[Record]:
        self.records, self.left = [], n
        self.done = asyncio.get_running_loop().create_future()
        self.active = 0
        loop = asyncio.get_running_loop()
        for i, w in enumerate(self.workers):
            if self.left:
                self.active += 1
                self.left -= 1  # claimed now, sent when its turn comes
                loop.call_later(i * self.spread_s / len(self.workers), self._send, w)
        await self.done
        return self.records

    def _next(self, w: Worker) -> None:
        self.left -= 1
        self._send(w)

    def _send(self, w: Worker) -> None:
        self.n += 1
        if not self.groups:
            rid = f"{self.label}-{self.n}"
            w.send(rid, self.request(rid))
            return
        g = group_of(self.n, self.groups)
        rid = f"{self.label}-{self.n}-g{g}"
        w.send(rid, self.request(rid, f"{preamble(g)} question {self.n}"))

    def finish(self, w: Worker, rec: Record, ok: bool) -> None:
        if not ok or rec.chunks < self.tokens:
            rec.status = rec.status if rec.status != 200 else 599
        self.records.append(rec)
        if self.left and w.transport is not None:
            self._next(w)
            return
        self.active -= 1
        if self.active == 0 and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        for w in self.workers:
            if w.transport is not None:
                w.transport.close()


# --- processes ----------------------------------------------------------------------------
def start(argv: list[str], name: str, logdir: Path, env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    log = open(logdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


def stop(proc: subprocess.Popen[bytes]) -> None:
    from kvlab.engines import stop_group

    stop_group(proc.pid, 5.0, proc.poll)


def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 5
         ) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,  # noqa: S310 - loopback
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def wait_serving(port: int, proc: subprocess.Popen[bytes], name: str, timeout: float = 90
                 ) -> None:
    deadline = time.monotonic() + timeout
    body = {"model": "fake-model", "prompt": "warm", "max_tokens": 2}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode} during start")
        if http("POST", f"http://127.0.0.1:{port}/v1/completions", body)[0] == 200:
            return
        time.sleep(0.3)
    raise SystemExit(f"{name} did not serve within {timeout:.0f} s")


# --- measurement --------------------------------------------------------------------------
@dataclass
class Level:
    c: int
    n: int = 0
    failures: int = 0
    wall_s: float = 0.0
    chunks_per_s: float = 0.0
    cpu_ms_per_req: float | None = None
    ttft_ms: dict[str, float] = field(default_factory=dict)
    ttfts: list[float] = field(default_factory=list)
    residual_ms: list[float] = field(default_factory=list)
    overhead_ms: dict[str, float] = field(default_factory=dict)
    overhead_plain_ms: dict[str, float] = field(default_factory=dict)
    self_added: dict[str, float] = field(default_factory=dict)  # kvlab's own /metrics
    prefill_ms: float = float("nan")  # the prefill leg's own median service time (stamps)
    hit_share: float | None = None  # --prefix-groups: requests whose group its leg had seen


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def prefill_service(prefill_ports: list[int]) -> dict[str, float]:
    """Every prefill upstream's own service time per request id."""
    out: dict[str, float] = {}
    for port in prefill_ports:
        status, raw = http("GET", f"http://127.0.0.1:{port}/stats", timeout=30)
        for r in json.loads(raw)["records"] if status == 200 else []:
            if r["first_ns"]:
                out[r["xrid"] or f"{port}sid{r['sid']}"] = (r["first_ns"] - r["arr_ns"]) / 1e6
    return out


async def measure(target: str, port: int, pid: int | None, c: int, n: int, tokens: int,
                  prefill_ports: list[int], spread_s: float, groups: int = 0
                  ) -> tuple[Level, list[Record]]:
    run = Run("/v1/completions", tokens, f"{target}{c}", spread_s, groups)
    await run.connect(port, c)
    await run.go(c)  # warm-up: one request per connection, not recorded
    for p in prefill_ports:
        http("POST", f"http://127.0.0.1:{p}/reset")
    proc = psutil.Process(pid) if pid else None
    own0 = _self_added(port) if target == "kvlab" else None
    cpu0 = _cpu(proc)
    t0 = time.perf_counter()
    records = await run.go(n)
    wall = time.perf_counter() - t0
    cpu1 = _cpu(proc)
    run.close()
    level = Level(c, n=len(records), wall_s=wall)
    own1 = _self_added(port) if target == "kvlab" else None
    if own0 is not None and own1 is not None and own1[0] > own0[0]:
        n_own = own1[0] - own0[0]
        level.self_added = {"mean_ms": (own1[1] - own0[1]) / n_own * 1000,
                            "share_under_1ms": (own1[2] - own0[2]) / n_own}
    ok = [r for r in records if r.status == 200]
    if groups and target != "direct":
        level.hit_share = hit_share(prefill_ports)
    level.failures = len(records) - len(ok)
    level.chunks_per_s = sum(r.chunks for r in ok) / wall
    # cpu_times() ticks in 10 ms steps: below a few ticks the figure would be noise
    if proc is not None and cpu1 - cpu0 >= 0.05:
        level.cpu_ms_per_req = (cpu1 - cpu0) * 1000 / max(1, len(records))
    ttft = [(r.first - r.sent) / 1e6 for r in ok]
    level.ttft_ms = {"p50": pct(ttft, 50), "p99": pct(ttft, 99)}
    level.ttfts = ttft
    level.residual_ms = [(r.first - r.sent - (r.srv_first - r.srv_arr)) / 1e6 for r in ok]
    return level, ok


def hit_share(prefill_ports: list[int]) -> float | None:
    """Of the level's requests, the share whose prefix group their prefill leg had already
    seen in the level (a prefix cache that never evicts would hit them), from each leg's own
    records in arrival order (the group read from the prompt's opening, as it arrived)."""
    seen, hits, total = set(), 0, 0
    for port in prefill_ports:
        status, raw = http("GET", f"http://127.0.0.1:{port}/stats", timeout=30)
        records = json.loads(raw)["records"] if status == 200 else []
        for r in sorted(records, key=lambda r: r["arr_ns"]):
            group = (r.get("opening") or "").removeprefix('"group ').partition(":")[0]
            if not group.isdigit():  # not a grouped request
                continue
            total += 1
            hits += (port, group) in seen
            seen.add((port, group))
    return hits / total if total else None


def _self_added(port: int) -> tuple[float, float, float] | None:
    """kvlab's own view of its added time: (count, sum s, count <= 1 ms), from /metrics."""
    from kvlab.observe.metrics import parse

    status, raw = http("GET", f"http://127.0.0.1:{port}/metrics")
    if status != 200:
        return None
    snap = parse(raw.decode())
    count = snap.total("kvlab_proxy_added_seconds_count")
    total = snap.total("kvlab_proxy_added_seconds_sum")
    under = snap.total("kvlab_proxy_added_seconds_bucket", {"le": "0.001"})
    if count is None or total is None or under is None:
        return None
    return count, total, under


def _cpu(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def overheads(level: Level, ok: list[Record], direct: Level, service: dict[str, float]
              ) -> None:
    base = pct(direct.residual_ms, 50)
    fallback = statistics.median(service.values()) if service else 0.0
    level.prefill_ms = fallback
    values = [res - service.get(r.rid, fallback) - base
              for r, res in zip(ok, level.residual_ms, strict=True)]
    level.overhead_ms = {"p50": pct(values, 50), "p99": pct(values, 99)}
    # BENCHMARKS.md's plain form: client TTFT - direct TTFT p50 - this request's prefill time
    direct_ttft = pct(direct.ttfts, 50)
    plain = [ttft - service.get(r.rid, fallback) - direct_ttft
             for r, ttft in zip(ok, level.ttfts, strict=True)]
    level.overhead_plain_ms = {"p50": pct(plain, 50), "p99": pct(plain, 99)}


# --- targets ------------------------------------------------------------------------------
def target_argv(name: str, args: argparse.Namespace, port: int, pfs: list[int],
                dcs: list[int]) -> list[str] | None:
    if name == "kvlab":
        legs = [x for p in pfs for x in ("--prefill", f"127.0.0.1:{p}")] + \
            [x for d in dcs for x in ("--decode", f"127.0.0.1:{d}")]
        balance = ["--balance", args.kvlab_balance]
        if args.kvlab_balance == "prefix-affinity":
            balance += ["--tokenizer", args.tokenizer]
        return [sys.executable, "-m", "kvlab", "proxy", *legs, "--port", str(port),
                "--connector", args.kvlab_connector, "--workers", str(args.kvlab_workers),
                *balance]
    if name == "router":
        if not args.router_bin or not Path(args.router_bin).exists():
            return None
        legs = [x for p in pfs for x in ("--prefill", f"http://127.0.0.1:{p}")] + \
            [x for d in dcs for x in ("--decode", f"http://127.0.0.1:{d}")]
        return [args.router_bin, "--vllm-pd-disaggregation", "--host", "127.0.0.1", "--port",
                str(port), *legs, "--policy", args.router_policy,
                "--prometheus-port", str(free_port())]
    if name == "demo":
        if not args.demo or not Path(args.demo).exists():
            return None
        return [args.demo_python, args.demo, "--model", "fake-model", "--prefill",
                f"127.0.0.1:{pfs[0]}", "--decode", f"127.0.0.1:{dcs[0]}", "--port", str(port)]
    raise ValueError(name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--quick", action="store_true", help="fewer requests per level")
    ap.add_argument("--levels", default="1,16,64,256", help="concurrency levels")
    ap.add_argument("--per-level", type=int, default=0,
                    help="requests per level per connection (default 25, quick 6)")
    ap.add_argument("--targets", default="kvlab,router,demo",
                    help="proxies to measure besides direct")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--kvlab-connector", default="nixl", help="protocol kvlab speaks")
    ap.add_argument("--burst-start", action="store_true",
                    help="start each level with all its requests at once (default: spread "
                         "the first requests over one request's length)")
    ap.add_argument("--legs", type=int, default=1,
                    help="synthetic upstreams per side: N prefill and N decode (16 legs: 8)")
    ap.add_argument("--kvlab-balance", default="round-robin",
                    help="kvlab proxy's --balance (prefix-affinity reads --tokenizer)")
    ap.add_argument("--tokenizer", default=str(Path.home() / ".cache" / "kvlab" / "models"
                                               / "tiny-qwen3-seed0" / "hf"),
                    help="the model directory kvlab's prefix affinity tokenizes with")
    ap.add_argument("--router-policy", default="round_robin",
                    help="vllm-router's --policy (cache_aware: its prefix tree)")
    ap.add_argument("--kvlab-workers", type=int, default=2,
                    help="kvlab proxy worker processes (its default, PROXY_WORKERS, is 2)")
    ap.add_argument("--upstream", default=str(HERE / "synthetic_upstream.py"),
                    help="the fake engine to run as both legs (BENCHMARKS.md's anchors used "
                         "shared/bench/fake_upstream.py; same interface)")
    ap.add_argument("--upstream-python", default=sys.executable,
                    help="the interpreter for --upstream (fake_upstream.py needs orjson)")
    ap.add_argument("--router-bin", default=_first_existing(
        f"{ANCHORS}/bin/vllm-router", "vllm-router"))
    ap.add_argument("--demo", default=_first_existing(f"{ANCHORS}-src/disagg_proxy_demo.py"))
    ap.add_argument("--demo-python", default=f"{ANCHORS}/bin/python")
    ap.add_argument("--prefix-groups", type=int, default=0,
                    help="requests in this many prefix groups (each a ~200-token opening of "
                         "its own, then the request's question), so affinity routers spread "
                         "them; the prefill legs' hit share is reported (0: one prompt)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="whole passes, the targets' order alternating (A B, B A, ...); "
                         "the report gives each figure's median and spread over them")
    ap.add_argument("--json-out", help="write every figure to this JSON file")
    return ap.parse_args(argv)


def _first_existing(*candidates: str) -> str | None:
    import shutil

    for c in candidates:
        if Path(c).exists():
            return c
        if "/" not in c and (found := shutil.which(c)):
            return found
    return None


async def bench(args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    levels = [int(x) for x in args.levels.split(",")]
    pfs = [free_port() for _ in range(args.legs)]
    dcs = [free_port() for _ in range(args.legs)]
    up = [args.upstream_python, args.upstream, "--ttft-ms", str(args.ttft_ms),
          "--itl-ms", str(args.itl_ms), "--tokens", str(args.tokens)]
    ups = [start([*up, "--port", str(p), "--name", f"{role}{i}"], f"{role}{i}", logdir)
           for role, ports in (("prefill", pfs), ("decode", dcs))
           for i, p in enumerate(ports)]
    results: dict[str, Any] = {"load_before": os.getloadavg(), "levels": levels,
                               "targets": {}, "skipped": [], "runs": []}
    names = args.targets.split(",")
    try:
        for proc, port in zip(ups, (*pfs, *dcs), strict=True):
            wait_serving(port, proc, "upstream")
        for r in range(args.repeat):
            order = names if r % 2 == 0 else names[::-1]  # A B, B A, ...: drift cancels
            print(f"-- run {r + 1} of {args.repeat}: {', '.join(order)} "
                  f"(load average {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
            one = await one_pass(args, levels, order, pfs, dcs, logdir, results["skipped"])
            one["load"] = os.getloadavg()[0]
            results["runs"].append(one)
    finally:
        for proc in ups:
            stop(proc)
    results["targets"] = results["runs"][0]["targets"] if results["runs"] else {}
    results["load_after"] = os.getloadavg()
    return results


async def one_pass(args: argparse.Namespace, levels: list[int], order: list[str],
                   pfs: list[int], dcs: list[int], logdir: Path, skipped: list[str]
                   ) -> dict[str, Any]:
    """Every level straight to decode, then through each target in `order`."""
    per = args.per_level or (6 if args.quick else 25)
    spread = 0.0 if args.burst_start else (2 * args.ttft_ms + args.tokens * args.itl_ms) / 1000
    out: dict[str, Any] = {"order": order, "targets": {}}
    direct: dict[int, Level] = {}
    for c in levels:
        direct[c], _ = await measure("direct", dcs[0], None, c, c * per, args.tokens,
                                     pfs, spread, args.prefix_groups)
        _say("direct", direct[c])
    out["targets"]["direct"] = {c: vars(lv) | {"residual_ms": None, "ttfts": None}
                                for c, lv in direct.items()}
    for name in order:
        port = free_port()
        argv = target_argv(name, args, port, pfs, dcs)
        if argv is None:
            if name not in skipped:
                skipped.append(name)
                print(f"[{name}] not found; skipped", file=sys.stderr)
            continue
        proc = start(argv, name, logdir)
        try:
            wait_serving(port, proc, name)
            got = {}
            for c in levels:
                level, ok = await measure(name, port, proc.pid, c, c * per, args.tokens,
                                          pfs, spread, args.prefix_groups)
                overheads(level, ok, direct[c], prefill_service(pfs))
                _say(name, level)
                got[c] = vars(level) | {"residual_ms": None, "ttfts": None}
            out["targets"][name] = got
        finally:
            stop(proc)
    return out


def _say(name: str, lv: Level) -> None:
    o, q = lv.overhead_ms, lv.overhead_plain_ms
    over = (f"overhead p50 {o['p50']:6.2f} p99 {o['p99']:7.2f} ms (plain {q['p50']:6.2f} / "
            f"{q['p99']:7.2f})" if o else "")
    cpu = f" cpu {lv.cpu_ms_per_req:5.2f} ms/req" if lv.cpu_ms_per_req is not None else ""
    if lv.hit_share is not None:
        cpu += f" hits {lv.hit_share:.1%}"
    if lv.self_added:
        cpu += (f" (own view: added mean {lv.self_added['mean_ms']:.2f} ms, "
                f"{lv.self_added['share_under_1ms']:.0%} under 1 ms)")
    print(f"[{name:>6}] c={lv.c:<4} n={lv.n:<5} fail={lv.failures:<3} ttft p50 "
          f"{lv.ttft_ms['p50']:7.2f} ms  {lv.chunks_per_s:8.0f} chunks/s  {over}{cpu}",
          file=sys.stderr, flush=True)


def report(results: dict[str, Any]) -> None:
    t = results["targets"]
    print(f"\nload average before {results['load_before'][0]:.2f}, after "
          f"{results['load_after'][0]:.2f} ({os.cpu_count()} cpus)")
    print("overhead: per request, with decode's own lateness taken out (server stamps); "
          "plain: BENCHMARKS.md's form,\nclient TTFT - direct TTFT p50 - prefill's time")
    print(f"{'target':<8}{'c':>5}{'fail':>6}{'ovh p50':>10}{'ovh p99':>10}{'plain p50':>10}"
          f"{'plain p99':>10}{'chunks/s':>10}{'cpu ms/req':>12}")
    nan = {"p50": float("nan"), "p99": float("nan")}
    for name, levels in t.items():
        for c, lv in levels.items():
            o, q = lv["overhead_ms"] or nan, lv["overhead_plain_ms"] or nan
            cpu = lv["cpu_ms_per_req"]
            print(f"{name:<8}{c:>5}{lv['failures']:>6}{o['p50']:>10.2f}{o['p99']:>10.2f}"
                  f"{q['p50']:>10.2f}{q['p99']:>10.2f}{lv['chunks_per_s']:>10.0f}"
                  f"{(cpu if cpu is not None else float('nan')):>12.2f}")
    k = t.get("kvlab")
    if not k:
        return
    for anchor in ("router", "demo"):
        if anchor not in t:
            continue
        print(f"\nkvlab / {anchor} (same run; < 1 is better for overhead and CPU, > 1 for "
              "chunks/s)")
        for c in k:
            a, b = k[c], t[anchor][c]
            oa, ob = a["overhead_ms"], b["overhead_ms"]
            qa, qb = a["overhead_plain_ms"], b["overhead_plain_ms"]
            print(f"  c={c:<4} overhead p50 {_ratio(oa['p50'], ob['p50'])}"
                  f"  p99 {_ratio(oa['p99'], ob['p99'])}"
                  f"  plain p50 {_ratio(qa['p50'], qb['p50'])}"
                  f"  p99 {_ratio(qa['p99'], qb['p99'])}"
                  f"  chunks/s {_ratio(a['chunks_per_s'], b['chunks_per_s'])}"
                  f"  cpu/req {_ratio(a['cpu_ms_per_req'], b['cpu_ms_per_req'])}")
    _targets(k)


def _spread(values: list[float]) -> str:
    """median [min, max] of a figure over the runs"""
    v = [x for x in values if x == x]
    if not v:
        return "n/a"
    return f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]"


def _figure(lv: dict[str, Any], key: str) -> float:
    if key == "chunks":
        return float(lv["chunks_per_s"])
    o = lv["overhead_ms"]
    return float(o[key]) if o else float("nan")


def report_runs(results: dict[str, Any]) -> None:
    """Each figure's median and spread over the passes; kvlab against each anchor run by
    run (the same pass), and its chunks/s against direct's."""
    runs = results["runs"]
    loads = ", ".join(f"{r['load']:.2f}" for r in runs)
    print(f"\n{len(runs)} passes, targets' order alternating; load average after each: "
          f"{loads}")
    print("median [min, max] over the passes")
    names = [n for n in runs[0]["targets"] if all(n in r["targets"] for r in runs)]
    for name in names:
        for c in results["levels"]:
            lvs = [r["targets"][name][c] for r in runs]
            print(f"  {name:<7} c={c:<4} overhead p50 {_spread([_figure(x, 'p50') for x in lvs])}"
                  f" ms  p99 {_spread([_figure(x, 'p99') for x in lvs])} ms  chunks/s "
                  f"{_spread([_figure(x, 'chunks') for x in lvs])}  failures "
                  f"{sum(x['failures'] for x in lvs)}" + _hits(lvs))
    if "kvlab" not in names:
        return
    for anchor in [n for n in names if n not in ("kvlab", "direct")]:
        print(f"\nkvlab / {anchor}, pass by pass (< 1: kvlab adds less)")
        for c in results["levels"]:
            p50 = [_figure(r["targets"]["kvlab"][c], "p50") / _figure(r["targets"][anchor][c],
                                                                       "p50") for r in runs]
            p99 = [_figure(r["targets"]["kvlab"][c], "p99") / _figure(r["targets"][anchor][c],
                                                                       "p99") for r in runs]
            print(f"  c={c:<4} p50 {_spread(p50)}  p99 {_spread(p99)}")
    print("\nkvlab chunks/s, pass by pass: / direct's (the client straight to decode), and /"
          " the two legs' ideal\n(direct's rate x its request time / (that + the prefill "
          "leg's own median service time): no proxy can wait less than prefill takes)")
    for c in results["levels"]:
        share = [_figure(r["targets"]["kvlab"][c], "chunks")
                 / _figure(r["targets"]["direct"][c], "chunks") for r in runs]
        ideal = [_figure(r["targets"]["kvlab"][c], "chunks") / _ideal(r, c) for r in runs]
        print(f"  c={c:<4} / direct {_spread(share)}   / ideal {_spread(ideal)}")


def _hits(levels: list[dict[str, Any]]) -> str:
    shares = [x["hit_share"] for x in levels if x.get("hit_share") is not None]
    return f"  hit share {_spread([100 * h for h in shares])} %" if shares else ""


def _ideal(run: dict[str, Any], c: int) -> float:
    """The chunks/s a client gets doing both legs itself, one after the other."""
    d, k = run["targets"]["direct"][c], run["targets"]["kvlab"][c]
    per_request_s = c * d["wall_s"] / max(1, d["n"])
    return float(d["chunks_per_s"]) * per_request_s / (per_request_s + k["prefill_ms"] / 1000)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0 or a != a or b != b:
        return "  n/a"
    return f"{a / b:5.2f}x"


def _targets(k: dict[int, Any]) -> None:
    print("\ntargets (BENCHMARKS.md):")
    if 64 in k:
        lv = k[64]
        _verdict("overhead p50 <= 1 ms at c64", lv["overhead_ms"]["p50"] <= 1.0)
        _verdict("overhead p99 <= 5 ms at c64", lv["overhead_ms"]["p99"] <= 5.0)
        _verdict("CPU <= 1.5 ms per request at c64", (lv["cpu_ms_per_req"] or 99) <= 1.5)
    if 256 in k:
        lv = k[256]
        _verdict(">= 22k chunks/s at c256, 0 failures",
                 lv["chunks_per_s"] >= 22000 and lv["failures"] == 0)


def _verdict(text: str, ok: bool) -> None:
    print(f"  {'met    ' if ok else 'NOT met'}  {text}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logdir = Path(ANCHORS).parent / f"proxy-bench-{os.getpid()}"
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        import uvloop

        results = uvloop.run(bench(args, logdir))
    except ImportError:  # pragma: no cover
        results = asyncio.run(bench(args, logdir))
    report(results)
    if len(results["runs"]) > 1:
        report_runs(results)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2, default=str))
    print(f"(process logs in {logdir})")


if __name__ == "__main__":
    main()
