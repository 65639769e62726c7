"""The compatibility contract between instances, checked before any traffic (`kvlab check`).

Two instances that disagree about the model, its revision, the tokenizer or chat template,
the context length, the block size or the KV dtype produce no error, only silent misses. This
module asks each instance what it is (OpenAI /v1/models, the engine's version, vLLM's
`vllm:cache_config_info` labels, llama-server's /props) and tokenises the same conversation on
each, then names every field on which they differ.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from kvlab.core.errors import RefusedError, UnreachableError
from kvlab.engines.base import InstanceFacts, all_engines, token_digest
from kvlab.measure.chat import api_base, server_root
from kvlab.observe import metrics

COMPARED = ("engine", "version", "model_id", "root", "max_model_len", "block_size",
            "cache_dtype", "template_tokens")


async def probe(client: httpx.AsyncClient, url: str) -> InstanceFacts:
    """Ask one instance what it is; UnreachableError if it does not answer /v1/models."""
    base, root = api_base(url), server_root(url)
    facts = InstanceFacts(url=base)
    try:
        models = await client.get(base + "/models")
    except httpx.HTTPError as exc:
        raise UnreachableError(f"{base} did not answer /v1/models ({exc}); is it running?") \
            from None
    if models.status_code != 200:
        raise UnreachableError(f"{base}/models answered HTTP {models.status_code}")
    data = (models.json().get("data") or [{}])[0]
    facts.model_id, facts.root = data.get("id"), data.get("root")
    facts.max_model_len = data.get("max_model_len")
    snap = await metrics.scrape(client, root + "/metrics")
    named = snap.engine() if snap else None
    # the engine its metrics name first; then each engine in turn, for servers without /metrics
    for engine in ([named] if named else []) + [e for e in all_engines() if e is not named]:
        if await engine.describe(client, root, facts, snap):
            return facts
    facts.notes.append("no engine kvlab knows answered its identity probes "
                       "(vLLM's /version, llama-server's /props)")
    return facts


@dataclass(frozen=True)
class Mismatch:
    field: str
    values: dict[str, str]

    def message(self) -> str:
        shown = ", ".join(f"{url}={value}" for url, value in self.values.items())
        return f"instances disagree on {self.field}: {shown}"


def differences(instances: list[InstanceFacts], ignore: tuple[str, ...] = ()) -> list[Mismatch]:
    """Every compared field on which the instances differ (unknown on all sides is no proof)."""
    out = []
    for name in COMPARED:
        if name in ignore:
            continue
        values = {f.url: getattr(f, name) for f in instances}
        if len({_key(v) for v in values.values()}) > 1:
            shown = {url: _show(name, value) for url, value in values.items()}
            out.append(Mismatch(name, shown))
    return out


def _key(value: Any) -> str:
    return repr(value)


def _show(name: str, value: Any) -> str:
    if name == "template_tokens" and isinstance(value, list):
        return f"{len(value)} tokens (sha {token_digest(value)})"
    return "unknown" if value is None else str(value)


async def check(urls: list[str], *, ignore: tuple[str, ...] = (), timeout_s: float = 20.0,
                headers: dict[str, str] | None = None) -> list[InstanceFacts]:
    """Probe every instance and refuse (RefusedError) if any compared field differs."""
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False, headers=headers) as client:
        facts = list(await asyncio.gather(*(probe(client, u) for u in urls)))
    problems = differences(facts, ignore)
    if problems:
        raise RefusedError(problems[0].message() + (
            f" (and {len(problems) - 1} more field(s): "
            + ", ".join(p.field for p in problems[1:]) + ")" if len(problems) > 1 else ""
        ) + "; start both from the same settings, or pass --ignore FIELD if you know why")
    return facts
