"""The compatibility contract between instances, checked before any traffic (`kvlab check`).

Two instances that disagree about the model, its revision, the tokenizer or chat template,
the context length, the block size or the KV dtype produce no error, only silent misses. This
module asks each instance what it is (OpenAI /v1/models, the engine's version, vLLM's
`vllm:cache_config_info` labels, llama-server's /props) and tokenises the same conversation on
each, then names every field on which they differ.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from kvlab.core.errors import RefusedError, UnreachableError
from kvlab.engines import vllm
from kvlab.measure.chat import api_base, server_root
from kvlab.observe import metrics

PROBE_MESSAGES = [
    {"role": "system", "content": "You check that two engines agree, token for token."},
    {"role": "user", "content": "Does 3 + 4 = 7? Answer with one word: {yes|no}."},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "And «7 × 6»? Émoji ok: 🙂 — tabs\tand newlines\nalso."},
]
COMPARED = ("engine", "version", "model_id", "root", "max_model_len", "block_size",
            "cache_dtype", "template_tokens")


@dataclass
class InstanceFacts:
    """What one instance says about itself."""

    url: str
    engine: str | None = None
    version: str | None = None
    model_id: str | None = None
    root: str | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    cache_dtype: str | None = None
    prefix_caching: bool | None = None
    kv_cache_tokens: int | None = None
    template_tokens: list[int] | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.template_tokens is not None:
            out["template_tokens"] = f"{len(self.template_tokens)} tokens, sha " + _digest(
                self.template_tokens)
        return out


def _digest(tokens: list[int]) -> str:
    import hashlib

    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:12]


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
    facts.engine = snap.engine() if snap else None
    if facts.engine is None or facts.engine == "vllm":
        await _vllm_facts(client, root, facts, snap)
    if facts.engine != "vllm":
        await _llama_facts(client, root, facts)
    return facts


async def _vllm_facts(client: httpx.AsyncClient, root: str, facts: InstanceFacts,
                      snap: metrics.Snapshot | None) -> None:
    version = await _get_json(client, root + "/version")
    if version and "version" in version:
        facts.engine, facts.version = "vllm", str(version["version"])
    if snap is not None:
        info = vllm.CACHE_CONFIG_INFO
        block = snap.label_value(info, "block_size")
        facts.block_size = int(block) if block and block.isdigit() else None
        facts.cache_dtype = snap.label_value(info, "cache_dtype")
        caching = snap.label_value(info, "enable_prefix_caching")
        facts.prefix_caching = None if caching is None else caching == "True"
        size = snap.label_value(info, "kv_cache_size_tokens")
        facts.kv_cache_tokens = int(size) if size and size.isdigit() else None
    tokens = await _post_json(client, root + "/tokenize", {
        "model": facts.model_id, "messages": PROBE_MESSAGES, "add_generation_prompt": True})
    if tokens and "tokens" in tokens:
        facts.template_tokens = [int(t) for t in tokens["tokens"]]


async def _llama_facts(client: httpx.AsyncClient, root: str, facts: InstanceFacts) -> None:
    props = await _get_json(client, root + "/props")
    if not props:
        facts.notes.append("neither vLLM's /version nor llama-server's /props answered")
        return
    facts.engine = "llama.cpp"
    facts.version = str(props.get("build_info", "unknown"))
    facts.root = str(props.get("model_path", facts.root))
    slot_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    facts.max_model_len = int(slot_ctx) if slot_ctx else facts.max_model_len
    facts.block_size = 1  # llama-server reuses a prompt prefix token by token
    facts.prefix_caching = True
    template = await _post_json(client, root + "/apply-template", {"messages": PROBE_MESSAGES})
    if template and "prompt" in template:
        tokens = await _post_json(client, root + "/tokenize",
                                  {"content": template["prompt"], "parse_special": True})
        if tokens and "tokens" in tokens:
            facts.template_tokens = [int(t) for t in tokens["tokens"]]


async def _get_json(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    try:
        response = await client.get(url)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


async def _post_json(client: httpx.AsyncClient, url: str,
                     payload: dict[str, Any]) -> dict[str, Any] | None:
    try:
        response = await client.post(url, json=payload)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


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
        return f"{len(value)} tokens (sha {_digest(value)})"
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
