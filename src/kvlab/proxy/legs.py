"""The engines behind the proxy: choosing one per request, and checking them before traffic.

A `LegPool` holds the prefill engines or the decode engines (XpYd: each may be repeated), or
plain replicas (the decode pool of a proxy with no prefill leg), and picks one per request:
round-robin, least-outstanding (ties broken round-robin), or by affinity (`affinity.py`: the
prompt's leading blocks, or its conversation, pick the replica, within a load bound). A leg
that could not be reached, or closed before answering, is left out of the choice for
`DOWN_S` seconds, then tried again by the next request that picks it; its failures are
counted (`Leg.failures`), and the requests it took (`Leg.picked`). With a pick log
(`PickLog`) every choice is written as one JSON line. The
start-up check asks every engine's /v1/models (naming a dead one by its role), refuses a
set that disagrees on the served model id or `max_model_len`, then runs `kvlab check`'s
whole comparison (`kvlab.measure.compat`): two engines that disagree produce no error, only silent
recomputation. A prefill leg whose connector only reads, or a decode leg whose connector only
writes (the two swapped), is refused by the role its own config states; a decode leg that is
a prefill leg's engine behind another address, by one request's counters.
`ProxyConfig.compat` takes any `async (prefill, decode) -> object` that raises a KvlabError
(None skips the check).
For Mooncake, prefill engines' bootstrap servers are asked for their engine ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import httpx

from kvlab.core import RefusedError, UnreachableError, connectors
from kvlab.engines import InstanceFacts, evidence_deltas
from kvlab.measure import compat
from kvlab.observe import metrics
from kvlab.proxy import affinity
from kvlab.proxy.pd import PrefillPeer
from kvlab.proxy.upstream import Origin

if TYPE_CHECKING:
    from prometheus_client import Gauge

Balance = Literal["round-robin", "least-outstanding", "prefix-affinity",
                  "conversation-affinity"]
BALANCES: tuple[Balance, ...] = get_args(Balance)
DOWN_S = 5.0  # a leg that failed to answer sits out this long before it is tried again
Keyer = Callable[[dict[str, object]], int]


class Leg:
    """One engine in one role, with its count of requests in flight (and a gauge of it)."""

    __slots__ = ("down_until", "failures", "gauge", "origin", "outstanding", "peer", "picked",
                 "role")

    def __init__(self, role: str, origin: Origin) -> None:
        self.role = role
        self.origin = origin
        self.outstanding = 0
        self.picked = 0  # requests sent its way
        self.failures = 0  # of them, those it could not be reached for or closed on
        self.down_until = 0.0  # time.monotonic() before which it is left out
        self.peer = PrefillPeer()
        self.gauge: Gauge | None = None  # a child of the outstanding gauge, when metrics are kept

    @property
    def url(self) -> str:
        return self.origin.url

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def failed(self, kind: str) -> None:
        """Count a failure; an engine that refused the connection or closed it before
        answering sits out `DOWN_S` (a timeout or a 5xx leaves it in: it is alive)."""
        self.failures += 1
        if kind in ("unavailable", "closed"):
            self.down_until = time.monotonic() + DOWN_S


class PickLog:
    """Every routing choice as one JSON line (appended whole: several workers share a file):
    the request id, the role, the leg's index and URL, and the digest of the request's
    messages (`affinity.body_digest`), so a run can tell which replica served which prompt."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, rid: bytes, leg: Leg, index: int, body: dict[str, object]) -> None:
        line = {"rid": rid.decode(), "role": leg.role, "leg": index, "url": leg.url,
                "body": affinity.body_digest(body)}
        os.write(self.fd, (json.dumps(line) + "\n").encode())

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class LegPool:
    """The engines of one role; `pick()` counts the choice, `done(leg)` uncounts it.

    `keyer`: the affinity key of a request body (prefix or conversation balance only);
    `load_factor`: how far above the mean in-flight count affinity may load one leg.
    `optional`: an empty pool is allowed (a proxy of plain replicas has no prefill legs)."""

    def __init__(self, role: str, urls: tuple[str, ...], balance: Balance,
                 connect_timeout_s: float, *, keyer: Keyer | None = None,
                 load_factor: float = affinity.DEFAULT_LOAD_FACTOR,
                 log: PickLog | None = None, optional: bool = False) -> None:
        if not urls and not optional:
            raise RefusedError(f"no {role} engine given: pass --{role} URL (or set "
                               f"{role.upper()}_HOST/{role.upper()}_PORT)")
        if balance.endswith("-affinity") and keyer is None:
            raise RefusedError(f"--balance {balance} needs the request's key: give the "
                               "model's tokenizer (--tokenizer) for prefix affinity")
        self.role = role
        self.legs = [Leg(role, Origin(u, connect_timeout_s)) for u in urls]
        self.balance = balance
        self.keyer = keyer
        self.load_factor = load_factor
        self.ring = affinity.Ring([leg.url for leg in self.legs])
        self.log = log
        self._next = 0

    def pick(self, body: dict[str, object] | None = None, rid: bytes = b"") -> Leg:
        """The leg for one request (`body`: the client's parsed request, for affinity)."""
        legs = self.legs
        now = time.monotonic()
        if self.keyer is not None and body is not None and len(legs) > 1:
            index = affinity.bounded_choice(self.ring, self.keyer(body), legs,
                                            self.load_factor, now)
        else:
            index = self._rotate(now)
        leg = legs[index]
        leg.outstanding += 1
        leg.picked += 1
        if leg.gauge is not None:
            leg.gauge.inc()
        if self.log is not None and body is not None:
            self.log.write(rid, leg, index, body)
        return leg

    def _rotate(self, now: float) -> int:
        """Round-robin (or the least outstanding from the round-robin point) over the legs
        that are up; all of them when none is."""
        legs = self.legs
        n = len(legs)
        i = self._next
        self._next = (i + 1) % n
        order = [(i + k) % n for k in range(n)]
        live = [j for j in order if legs[j].up(now)] or order
        if self.balance == "round-robin":
            return live[0]
        return min(live, key=lambda j: legs[j].outstanding)  # affinity without a body too

    @staticmethod
    def done(leg: Leg) -> None:
        leg.outstanding -= 1
        if leg.gauge is not None:
            leg.gauge.dec()

    def close(self) -> None:
        for leg in self.legs:
            leg.origin.close()
        if self.log is not None:
            self.log.close()
            self.log = None


@dataclass(frozen=True)
class LegFacts:
    role: str
    url: str
    model_id: str | None
    max_model_len: int | None

    def as_dict(self) -> dict[str, object]:
        return {"role": self.role, "url": self.url, "model_id": self.model_id,
                "max_model_len": self.max_model_len}


async def _models(client: httpx.AsyncClient, role: str, url: str) -> LegFacts:
    try:
        response = await client.get(f"{url}/v1/models")
        data = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        raise UnreachableError(f"the {role} instance is not answering on {url} "
                               f"({type(exc).__name__}); start it first") from None
    cards = data.get("data") if isinstance(data, dict) else None
    if not cards or not isinstance(cards[0], dict):
        raise UnreachableError(f"the {role} instance on {url} answered /v1/models with "
                               f"{response.status_code} and no model; is it an engine?")
    card = cards[0]
    length = card.get("max_model_len")
    return LegFacts(role, url, card.get("id"), length if isinstance(length, int) else None)


async def check_legs(prefill: list[str], decode: list[str], timeout_s: float = 10.0,
                     headers: dict[str, str] | None = None,
                     ignore: tuple[str, ...] = ()) -> list[LegFacts]:
    """Every engine answers /v1/models and all agree; else UnreachableError/RefusedError.

    First each engine by role (a dead one is named as prefill or decode), then the whole
    contract `kvlab check` compares (version, block size, KV dtype, chat-template tokens...),
    less the fields in `ignore`.
    """
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False,
                                 headers=headers) as client:
        answers = await asyncio.gather(*[_models(client, "prefill", u) for u in prefill],
                                       *[_models(client, "decode", u) for u in decode],
                                       return_exceptions=True)
    facts = []
    for answer in answers:  # the first failure in the order given, prefill first
        if isinstance(answer, BaseException):
            raise answer
        facts.append(answer)
    for name in ("model_id", "max_model_len"):
        values = {f"{f.role} {f.url}": getattr(f, name) for f in facts}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"{k} has {v}" for k, v in values.items())
            raise RefusedError(f"the engines disagree on {name}: {shown}; start them from the "
                               "same settings (same model, SERVED_NAME and CTX)")
    instances = await compat.check([*prefill, *decode], ignore=ignore, timeout_s=timeout_s,
                                   headers=headers)
    if compat.KV_ROLE not in ignore:
        check_roles(instances[:len(prefill)], instances[len(prefill):])
    await check_identity(prefill, decode, headers)
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False,
                                 headers=headers) as client:
        for fact in facts:  # the checks above sent prompts: each leg must have outlived them
            await _still_up(client, fact.role, fact.url)
    return facts


async def _still_up(client: httpx.AsyncClient, role: str, url: str) -> None:
    """UnreachableError when a leg that answered at the start no longer does."""
    try:
        alive = (await client.get(f"{url}/health")).status_code < 500
    except httpx.HTTPError:
        alive = False
    if not alive:
        raise UnreachableError(
            f"the {role} instance on {url} stopped answering during the proxy's start-up "
            "check (it answered at its start): see its log for the cause; the proxy did not "
            "start in front of it")


async def check_identity(prefill: list[str], decode: list[str],
                         headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
    """Refuse a decode leg that is a prefill leg's engine behind another address (a
    forwarder, another name for the host): one short request to each prefill leg must move
    that engine's own counters, and a decode leg whose counters moved alike is the same
    engine. Legs without /metrics are not judged."""
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False,
                                 headers=headers) as client:
        for url in prefill:
            urls = [url, *decode]
            before = {u: await metrics.scrape(client, metrics.metrics_url(u)) for u in urls}
            if before[url] is None:
                continue
            models = await compat.listed_models(client, url)
            body = {"prompt": f"kvlab leg identity {secrets.token_hex(8)}", "max_tokens": 1,
                    "temperature": 0, **({"model": models[0]} if models else {})}
            with contextlib.suppress(httpx.HTTPError):
                await client.post(f"{url}/v1/completions", json=body)
            after = {u: await metrics.scrape(client, metrics.metrics_url(u)) for u in urls}
            moved = evidence_deltas(before[url], after[url])
            if not any(v for v in moved.values()):
                continue
            for other in decode:
                if evidence_deltas(before[other], after[other]) == moved:
                    raise RefusedError(
                        f"{other} (a decode leg) is the same engine as the prefill leg {url}: "
                        "one request to the prefill leg moved both addresses' counters alike "
                        "(a forwarder, or another name for one host); decode would serve the "
                        "prompt from its own prefix cache and nothing would cross")


def check_roles(prefill: list[InstanceFacts], decode: list[InstanceFacts]) -> None:
    """Refuse a prefill leg that writes no KV or a decode leg that reads none, by the role
    its own connector config states (prefill and decode swapped, most often)."""
    for leg, facts, allowed in [*(("prefill", f, connectors.writes) for f in prefill),
                                *(("decode", f, connectors.reads) for f in decode)]:
        if facts.kv_role is not None and not allowed(facts.kv_role):
            raise RefusedError(
                f"{facts.url} is given as the {leg} leg but runs as {facts.kv_role} (its "
                f"--kv-transfer-config): the {leg} leg must "
                f"{'write' if leg == 'prefill' else 'read'} the KV; are prefill and decode "
                "swapped?")


async def mooncake_peers(pool: LegPool, bootstrap_port: int, timeout_s: float = 10.0) -> None:
    """Ask each prefill engine's Mooncake bootstrap server for its engine id (DP rank 0)."""
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
        for leg in pool.legs:
            host = leg.origin.host
            addr = f"http://{f'[{host}]' if ':' in host else host}:{bootstrap_port}"
            try:
                data = (await client.get(f"{addr}/query")).json()
                engine_id = str(data["0"]["engine_id"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                raise UnreachableError(
                    f"the Mooncake bootstrap server of prefill {leg.url} is not answering on "
                    f"{addr}/query; is the prefill instance started with CONNECTOR=mooncake?"
                ) from None
            leg.peer = PrefillPeer(bootstrap_addr=addr, engine_id=engine_id)
