"""`kvlab run disagg --part cancel` on a running pair: the figures `procedure.judge` reads.

With the prefill and decode engines and kvlab's proxy running (the disagg experiment's pair
session), the step:

1. streams a long-prompt request through the proxy, reads decode's counters once the first
   tokens have arrived, and closes the connection (the client going away); a cut that came
   after decode had finished is tried again with a fresh prompt, up to `ATTEMPTS` cuts;
2. waits until the proxy has counted the abort and decode has nothing running or waiting;
3. restarts decode: its process group stopped, the same plan started again and ready (the
   first life's log kept beside the new one);
4. asks prefill, decode and the proxy for /health, and sends a fresh request through the
   proxy, counting what each leg finished meanwhile.
Engine metric names come from the engine's adapter (`engines.base.evidence_deltas`); the
proxy's are kvlab's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial

import httpx

from kvlab.core import JsonObject, KvlabError, api_base
from kvlab.engines import EngineProcess, evidence_deltas
from kvlab.experiments.boundary import messages, tokenizer_for
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.procedure import (
    ATTEMPTS,
    PROXY_ABORTS,
    PROXY_REQUESTS,
    CancelSpec,
    judge,
    take_line,
    verdict,
)
from kvlab.observe import metrics
from kvlab.records import CANCEL, LAB_PD, CancelEvidence, ProcedureRecord, StreamCut

Snaps = dict[str, metrics.Snapshot | None]
AtCut = Callable[[], Awaitable[tuple[float | None, float | None]]]


async def cancel_restart(lab: Lab, spec: CancelSpec, pair: list[EngineProcess],
                         proxy: EngineProcess) -> ProcedureRecord:
    """The whole step on a running pair and proxy; its `procedure` line. Leaves decode
    stopped (the restarted one is stopped at the end of the step)."""
    prefill, decode = pair
    ev = CancelEvidence(max_tokens=spec.max_tokens, expected_tokens=spec.fresh_max_tokens)
    tokenizer = tokenizer_for(decode.plan.model)
    key = lab.settings.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = api_base(proxy.plan.base_url) + "/chat/completions"

    def body(name: str, tokens: int, answer: int, stream: bool) -> JsonObject:
        return {"model": lab.settings.served_name, "max_tokens": answer, "stream": stream,
                "ignore_eos": True, "messages": messages(tokenizer, tokens, name)}

    lab.say(f"==> cancel mid-stream ({spec.prompt}-token prompt), then restart decode")
    async with httpx.AsyncClient(timeout=120.0, trust_env=False, headers=headers) as client:
        for attempt in range(1, ATTEMPTS + 1):
            ev.attempts = attempt
            before = await _scrape(client, {"decode": decode, "proxy": proxy})
            ev.cut = await _stream_and_cut(
                url, body(f"cancel-{lab.run_id}-{attempt}", spec.prompt,
                          spec.max_tokens, True), headers, spec.cancel_after,
                partial(_at_cut, client, decode, before))
            ev.settled_s, after = await _settle(client, decode, proxy, before, spec.settle_s)
            if not ev.cut.late:
                break
            lab.say(f"    cut {attempt}: decode had already finished the answer; again")
        _read_cancel(ev, before, after)
        await _restart(lab, ev, decode)
        fresh = body(f"fresh-{lab.run_id}", spec.fresh_prompt_tokens, spec.fresh_max_tokens,
                     False)
        await _after_restart(lab, ev, client, prefill, decode, proxy, (url, fresh))
    checks = judge(ev)
    outcome, failed = verdict(checks)
    for check in checks:
        lab.say(f"    {'ok  ' if check.passed else 'FAIL'} {check.name}: {check.detail}")
    ev.spec = spec.as_record()
    return lab.record(ProcedureRecord(
        label=CANCEL.label, lab=LAB_PD, step=CANCEL.label, verdict=outcome, checks=checks,
        failed=failed, evidence=ev))


async def _scrape(client: httpx.AsyncClient, procs: dict[str, EngineProcess]) -> Snaps:
    return {role: await metrics.scrape(client, p.plan.metrics_url) for role, p in procs.items()}


async def _at_cut(client: httpx.AsyncClient, decode: EngineProcess,
                  before: Snaps) -> tuple[float | None, float | None]:
    """Decode's tokens generated since `before`, and its requests in flight, right now."""
    now = await _scrape(client, {"decode": decode})
    if now["decode"] is None:
        return None, None
    deltas = evidence_deltas(before["decode"] or now["decode"], now["decode"])
    return deltas.get("generation_tokens"), _busy(before, now)


async def _stream_and_cut(url: str, body: JsonObject, headers: dict[str, str],
                          after: int, at_cut: AtCut) -> StreamCut:
    """Stream the request; once `after` tokens have arrived, read decode, then close."""
    cut = StreamCut()
    started = time.perf_counter()
    try:
        # a client of its own: leaving the block with the body unread closes the connection,
        # which is how the proxy, and through it decode, learns that the client went away
        async with httpx.AsyncClient(timeout=120.0, trust_env=False, headers=headers) as c, \
                c.stream("POST", url, json=body) as response:
            cut.status = response.status_code
            if response.status_code != 200:
                cut.error = (await response.aread()).decode("utf-8", "replace")[:300]
            elif await _read_until(response, cut, after, started):
                cut.decode_generated, cut.decode_running = await at_cut()
    except httpx.HTTPError as exc:
        cut.error = f"{type(exc).__name__}: {exc}"
    cut.closed_after_s = round(time.perf_counter() - started, 4)
    return cut


async def _read_until(response: httpx.Response, cut: StreamCut, after: int,
                      started: float) -> bool:
    """Read until `after` tokens have arrived (True), or the answer ended first (False)."""
    async for line in response.aiter_lines():
        take_line(line, cut, started)
        if cut.finished or cut.error:
            return False
        if cut.tokens >= after:
            return True
    cut.error = f"the stream ended after {cut.tokens} tokens without finishing"
    return False


def _busy(before: Snaps, now: Snaps) -> float | None:
    """Requests running or waiting on decode now (None: its /metrics could not be read)."""
    if now["decode"] is None:
        return None
    gauges = evidence_deltas(before["decode"] or now["decode"], now["decode"])
    return float((gauges.get("requests_running_end") or 0)
                 + (gauges.get("requests_waiting_end") or 0))


def _proxy_delta(before: Snaps, now: Snaps, name: str, labels: dict[str, str]) -> float | None:
    then, after = before.get("proxy"), now.get("proxy")
    if then is None or after is None:
        return None
    return metrics.counter_delta(then, after, name, labels)


async def _settle(client: httpx.AsyncClient, decode: EngineProcess, proxy: EngineProcess,
                  before: Snaps, settle_s: float) -> tuple[float | None, Snaps]:
    """Seconds until the proxy counted the abort and decode has nothing in flight."""
    started = time.monotonic()
    while True:
        now = await _scrape(client, {"decode": decode, "proxy": proxy})
        aborted = _proxy_delta(before, now, PROXY_REQUESTS, {"outcome": "aborted"})
        if (aborted or 0) >= 1 and _busy(before, now) == 0:
            return round(time.monotonic() - started, 2), now
        if time.monotonic() - started > settle_s:
            return None, now
        await asyncio.sleep(0.25)


def _read_cancel(ev: CancelEvidence, before: Snaps, after: Snaps) -> None:
    ev.proxy_aborted = _proxy_delta(before, after, PROXY_REQUESTS, {"outcome": "aborted"})
    ev.proxy_aborts_by_stage = {stage: _proxy_delta(before, after, PROXY_ABORTS,
                                                    {"stage": stage})
                                for stage in ("prefill", "decode")}
    ev.decode = evidence_deltas(before["decode"], after["decode"])


async def _restart(lab: Lab, ev: CancelEvidence, decode: EngineProcess) -> None:
    """Stop decode's process group; the caller starts the same plan again."""
    started = time.monotonic()
    ev.restart.pids = [decode.pid]
    ev.restart.exit_code = await decode.stop()
    ev.restart.stop_s = round(time.monotonic() - started, 2)
    # the same plan writes the same log path: keep the first life's log beside it, so the
    # restarted engine's startup line reads its own start only
    kept = decode.log_path.with_suffix(".before-restart.log")
    if decode.log_path.exists():
        decode.log_path.rename(kept)
        ev.restart.first_log = str(kept)
    lab.say(f"    decode stopped in {ev.restart.stop_s:.1f} s; starting it again")


async def _after_restart(lab: Lab, ev: CancelEvidence, client: httpx.AsyncClient,
                         prefill: EngineProcess, decode: EngineProcess, proxy: EngineProcess,
                         fresh: tuple[str, JsonObject]) -> None:
    """Start decode again from the same plan, then ask everyone for health and a request."""
    try:
        async with engines(lab, [decode.plan], labels=["disagg-decode-restarted"]) as (again,):
            ev.restart.ok, ev.restart.ready_s = True, again.ready_s
            ev.restart.pids.append(again.pid)
            ev.health = await _health(client, prefill, again, proxy)
            await _fresh(ev, client, {"prefill": prefill, "decode": again, "proxy": proxy},
                         *fresh)
    except KvlabError as exc:
        if ev.restart.ok:
            ev.fresh.error = ev.fresh.error or str(exc)
        else:
            ev.restart.error = str(exc)
            ev.health = await _health(client, prefill, None, proxy)


async def _health(client: httpx.AsyncClient, prefill: EngineProcess,
                  decode: EngineProcess | None, proxy: EngineProcess) -> dict[str, str]:
    async def engine(proc: EngineProcess | None) -> str:
        if proc is None:
            return "not running: the restart failed"
        if proc.returncode is not None:
            return f"exited with code {proc.returncode}"
        return "ok" if await proc.healthy() else f"{proc.plan.health_url} did not answer 200"

    out = {"prefill": await engine(prefill), "decode": await engine(decode)}
    try:
        answer = await client.get(proxy.plan.health_url)
        out["proxy"] = "ok" if answer.status_code == 200 else (
            f"HTTP {answer.status_code}: {' '.join(answer.text.split())[:200]}")
    except httpx.HTTPError as exc:
        out["proxy"] = f"no answer: {type(exc).__name__}: {exc}"
    return out


async def _fresh(ev: CancelEvidence, client: httpx.AsyncClient,
                 procs: dict[str, EngineProcess], url: str, body: JsonObject) -> None:
    """One new request through the proxy; the answer and who served it."""
    before = await _scrape(client, procs)
    try:
        answer = await client.post(url, json=body)
        ev.fresh.status = answer.status_code
        if answer.status_code != 200:
            ev.fresh.error = " ".join(answer.text.split())[:300]
        else:
            doc = answer.json()
            ev.fresh.completion_tokens = (doc.get("usage") or {}).get("completion_tokens")
            ev.fresh.finish_reason = (doc.get("choices") or [{}])[0].get("finish_reason")
    except (httpx.HTTPError, ValueError) as exc:
        ev.fresh.error = f"{type(exc).__name__}: {exc}"
    after = await _scrape(client, procs)
    ev.fresh_served = {
        role: evidence_deltas(before[role], after[role]).get("requests_succeeded")
        for role in ("prefill", "decode")}
    ev.fresh_served["proxy_ok"] = _proxy_delta(before, after, PROXY_REQUESTS, {"outcome": "ok"})
