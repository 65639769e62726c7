"""The compatibility contract between instances, checked before any traffic (`kvlab check`).

Two instances that disagree about the model, its revision, the tokenizer or chat template,
the context length, the block size, the KV dtype or the numbers the model computes produce no
error, only silent misses (or, sharing a store, a reader that crashes on the other's KV). This
module asks each instance what it is (OpenAI /v1/models, the engine's version, vLLM's
`vllm:cache_config_info` labels, llama-server's /props; for an instance on this machine also
its command line and its model files' content), tokenises the same conversation on each, asks
each the same short question with logprobs (`fingerprint.py`), and names every field on which
they differ.

Identity is content, not location: the model's config, tokenizer and sampled weights
(`content_digest`) and the behavioural fingerprint decide; a different path (`root`) is a
note. A content difference names the file and, in a JSON file, the key with both values; a
part the engine does not read (vLLM: tokenizer_config.json's template beside a
chat_template.jinja) is a note. Prefix caching and the connector are compared as each
instance states them, and the KV roles must let one instance write what another reads. A
field one instance leaves unknown (another machine's command line) is not compared; the
fingerprint still is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from kvlab.core import InputError, RefusedError, UnreachableError, api_base, connectors, server_root
from kvlab.engines import (
    InstanceFacts,
    all_engines,
    known_engine,
    local,
    source_of,
    store_for,
    token_digest,
)
from kvlab.observe import fingerprint, metrics

# compared on every instance, an unknown value included (the server answers these itself)
COMPARED = ("engine", "version", "model_id", "adapters", "max_model_len", "block_size",
            "template_tokens")
# compared where every instance's value is known (read from a local command line or files)
COMPARED_WHERE_KNOWN = ("prefix_caching", "connector", "content_digest", "dtype",
                        "quantization", "cache_dtype", "numerics_flags", "kv_store")
KV_ROLE = "kv_role"  # compared as a whole: one instance must write what another reads
FINGERPRINT = "fingerprint"  # the behavioural comparison's name, for --ignore
CONTENT = "content_digest"
FIELDS = (*COMPARED, *COMPARED_WHERE_KNOWN, KV_ROLE, FINGERPRINT)
NOTED = ("root",)  # where the model lies: a difference is a note, never a refusal
_UNKNOWN = (None, "auto")  # "auto" dtype: vLLM resolves it from the config, kvlab cannot


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
    try:
        body = models.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise UnreachableError(f"{base}/models answered no JSON object; is it an engine?")
    listed = [d for d in body.get("data") or [] if isinstance(d, dict)]
    facts.listed_models = [str(d["id"]) for d in listed if d.get("id")]
    facts.adapters = [f"{d['id']} (LoRA on {d['parent']})" for d in listed
                      if d.get("id") and d.get("parent")]
    data = next((d for d in listed if not d.get("parent")), listed[0] if listed else {})
    facts.model_id, facts.root = data.get("id"), data.get("root")
    facts.max_model_len = data.get("max_model_len")
    snap = await metrics.scrape(client, root + "/metrics")
    named = source_of(snap)
    # the engine its metrics name first; then each engine in turn, for servers without /metrics
    for engine in ([named] if named else []) + [e for e in all_engines() if e is not named]:
        if await engine.describe(client, root, facts, snap):
            return facts
    facts.notes.append("no engine kvlab knows answered its identity probes "
                       "(vLLM's /version, llama-server's /props)")
    return facts


def served_model(asked: str, facts: InstanceFacts) -> tuple[str, str]:
    """The model name to send: `asked` when the instance lists it (or lists nothing), else
    the one model it lists, with the words that say so; InputError when it lists several."""
    return pick_model(asked, facts.listed_models, facts.url)


def pick_model(asked: str, listed: Sequence[str], url: str, *,
               named: bool = False) -> tuple[str, str]:
    """`asked` when `url` lists it (or lists nothing); else the one model it lists, with the
    words that say so. InputError when it lists several, or, for a name the user gave
    (`named`), when the list does not hold it: no request would have been answered."""
    if not listed or asked in listed:
        return asked, ""
    shown = ", ".join(map(repr, listed))
    if named:
        raise InputError(f"--model {asked!r}: {url} serves {shown}; name one of those with "
                         "--model or SERVED_NAME")
    if len(listed) == 1:
        return listed[0], (f"model {listed[0]!r}: the one {url} serves ({asked!r} is not "
                           "among its models)")
    raise InputError(f"--model {asked!r}: {url} serves {shown}; name one with --model or "
                     "SERVED_NAME")


async def listed_models(client: httpx.AsyncClient, url: str) -> list[str]:
    """The ids `url`'s /v1/models lists; [] when it does not answer with a list."""
    try:
        response = await client.get(api_base(url) + "/models")
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return []
    data = body.get("data") if isinstance(body, dict) else None
    return [str(d["id"]) for d in data or [] if isinstance(d, dict) and d.get("id")]


@dataclass(frozen=True)
class Mismatch:
    field: str
    values: dict[str, str]
    detail: str = ""

    def message(self) -> str:
        shown = ", ".join(f"{url}={value}" for url, value in self.values.items())
        if self.field == FINGERPRINT:
            return f"numerics differ (behavioural fingerprint): {self.detail}: {shown}"
        if self.detail:
            return f"instances disagree on {self.field}: {shown} ({self.detail})"
        return f"instances disagree on {self.field}: {shown}"

    def as_dict(self) -> dict[str, object]:
        return {"field": self.field, "values": self.values, "detail": self.detail,
                "message": self.message()}


@dataclass
class Compatibility:
    """Every instance's facts, every disagreement, and what differs harmlessly."""

    instances: list[InstanceFacts]
    mismatches: list[Mismatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    store_faults: list[str] = field(default_factory=list)  # a shared store they cannot serve

    @property
    def compatible(self) -> bool:
        return not self.mismatches and not self.store_faults

    def refusal(self) -> str:
        """One line naming every disagreement, each with both values, and every store fault."""
        if not self.mismatches:
            return "; ".join(self.store_faults)
        return ("; ".join([*(m.message() for m in self.mismatches), *self.store_faults])
                + "; start both from the same settings, or pass --ignore FIELD if you know why")

    def as_dict(self) -> dict[str, object]:
        return {"compatible": self.compatible,
                "instances": [f.as_record().model_dump(mode="json") for f in self.instances],
                "mismatches": [m.as_dict() for m in self.mismatches], "notes": self.notes,
                "store_faults": self.store_faults,
                "compared": list(FIELDS),
                "fingerprint_tolerance": fingerprint.TOLERANCE}


def differences(instances: list[InstanceFacts], ignore: tuple[str, ...] = ()) -> list[Mismatch]:
    """Every compared field on which the instances differ, then the fingerprint."""
    out = []
    for name in (*COMPARED, *COMPARED_WHERE_KNOWN):
        if name in ignore:
            continue
        values = {f.url: getattr(f, name) for f in instances}
        if name in COMPARED_WHERE_KNOWN and any(v in _UNKNOWN for v in values.values()):
            continue
        if len({repr(v) for v in values.values()}) > 1:
            read, _ = content_read(instances) if name == CONTENT else ([], [])
            if name != CONTENT or read:
                out.append(Mismatch(name, {url: _show(name, v) for url, v in values.items()},
                                    "; ".join(read)))
    if KV_ROLE not in ignore and (found := role_mismatch(instances)) is not None:
        out.append(found)
    if FINGERPRINT not in ignore:
        found = fingerprint_mismatch(instances)
        if found is not None:
            out.append(found)
    return out


def content_read(instances: list[InstanceFacts]) -> tuple[list[str], list[str]]:
    """What differs in the models' files between the first instance and each other one, as
    (what the engines read: the refusal's detail; what they do not: notes). Each names the
    file and, in a JSON file, the key with both values; a part an engine does not read (the
    adapter's `unread_content`) is only noted, as is a chat template that both servers render
    to the same tokens (whitespace, comments). Roots this machine cannot read are skipped, so
    with none readable the digest alone is the detail."""
    first, read, unread = instances[0], [], []
    for other in instances[1:]:
        if first.content_digest == other.content_digest or not (first.root and other.root):
            continue
        theirs = _unread(other)
        skipped = {k: why for k, why in _unread(first).items() if k in theirs}
        same_tokens = (first.template_tokens is not None
                       and first.template_tokens == other.template_tokens)
        for file, key, a, b in local.content_differences(first.root, other.root):
            where = f"{file} {key}".strip()
            shown = f"{where} {a} against {b}" if key else f"{where} differs"
            if (file, key) in skipped:
                unread.append(f"{shown}: {skipped[(file, key)]}: a note, not a refusal")
            elif same_tokens and (file, key) in local.TEMPLATE_PARTS:
                unread.append(f"{shown}, yet both servers render the same template tokens: "
                              "a note, not a refusal")
            else:
                read.append(shown)
    return read, unread


def _unread(facts: InstanceFacts) -> dict[tuple[str, str], str]:
    engine = known_engine(facts.engine) if facts.engine else None
    return engine.unread_content(facts.root) if engine is not None and facts.root else {}


def role_mismatch(instances: list[InstanceFacts]) -> Mismatch | None:
    """Instances that share KV through a connector but where none writes what another reads
    (two consumers, two producers); unknown roles are not judged."""
    roles = {f.url: f.kv_role for f in instances}
    if len(instances) < 2 or any(r is None for r in roles.values()):
        return None
    known = set(roles.values())
    why = ("no instance writes KV for another to read" if not any(map(connectors.writes, known))
           else "no instance reads the KV another writes"
           if not any(map(connectors.reads, known)) else "")
    return Mismatch(KV_ROLE, {u: str(r) for u, r in roles.items()}, why) if why else None


def fingerprint_mismatch(instances: list[InstanceFacts]) -> Mismatch | None:
    """The first instance whose fingerprint is farther from the first's than the tolerance."""
    known = [f for f in instances if f.fingerprint is not None]
    if len(known) < 2:
        return None
    first = known[0]
    assert first.fingerprint is not None
    for other in known[1:]:
        assert other.fingerprint is not None
        d = fingerprint.distance(first.fingerprint, other.fingerprint)
        if not d.agrees():
            detail = (f"the same probe's top-{fingerprint.TOP_K} logprobs differ by up to "
                      f"{d.value:.1e} (tolerance {fingerprint.TOLERANCE:.0e}) at generated "
                      f"token {d.position + 1}")
            values = {first.url: f"{d.token!r} {d.seen_a}", other.url: f"{d.token!r} {d.seen_b}"}
            return Mismatch(FINGERPRINT, values, detail)
    return None


def notes(instances: list[InstanceFacts], *, fingerprinted: bool = True) -> list[str]:
    """What differs without mattering (the model's path), and what could not be compared."""
    out = []
    for name in NOTED:
        values = {f.url: getattr(f, name) for f in instances}
        if len(set(values.values())) > 1:
            digests = {f.content_digest for f in instances}
            same = (f"the content is the same (digest {digests.pop()})"
                    if len(digests) == 1 and None not in digests else
                    "the content differs (content_digest names what)" if None not in digests
                    else "the content is compared by the behavioural fingerprint")
            shown = ", ".join(f"{url}={v}" for url, v in values.items())
            out.append(f"the model lies at different paths ({shown}); {same}: a note, not a "
                       "refusal")
    unknown = [f.url for f in instances if f.numerics_flags is None]
    if unknown:
        out.append("command line not readable for " + ", ".join(unknown) + " (another "
                   "machine, or another account): dtype, KV type and store compared only "
                   "through what the server says and the fingerprint")
    if len(instances) > 1:
        out += content_read(instances)[1]
    if fingerprinted and sum(f.fingerprint is not None for f in instances) < len(instances) > 1:
        out.append("an instance answered no logprobs: numerics not compared behaviourally")
    return out


def _show(name: str, value: object) -> str:
    if name == "template_tokens" and isinstance(value, list):
        return f"{len(value)} tokens (sha {token_digest(value)})"
    if name == "adapters" and isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return "unknown" if value is None else str(value)


def clients_name(facts: list[InstanceFacts], model: str | None) -> str | None:
    """The model name the fingerprint's probe goes under: `model` (the name clients send)
    where every instance lists it, else the one name every instance lists (clients sent
    through a front reach each by it), else None (each instance's own first model)."""
    common = set.intersection(*(set(f.listed_models) for f in facts)) if facts else set()
    if model is not None and model in common:
        return model
    shared = [name for name in (facts[0].listed_models if facts else []) if name in common]
    return shared[0] if len(shared) == 1 else None


async def compare(urls: list[str], *, ignore: tuple[str, ...] = (), timeout_s: float = 20.0,
                  headers: dict[str, str] | None = None,
                  model: str | None = None) -> Compatibility:
    """Probe every instance and name what differs; refuses nothing.

    The facts first (what the servers and their command lines say); the behavioural
    fingerprint after, and where an instance reports a KV connector only when the facts
    agree. The fingerprint's probe is one prompt sent to every
    instance, so on a shared store the second instance reads the KV the first one wrote: a
    decode in float16 loading a prefill's bfloat16 KV died of it (`Index put requires the
    source and destination dtypes match`), so no instance is asked to load another's KV before
    the facts say they compute alike. One instance at a time: vLLM's shared-storage connector
    takes an entry's directory for the whole entry, so a consumer probed alongside found it
    half written and died on the missing layer file (CI, 2026-11-30). An instance that stops
    answering after its probe stops the check with UnreachableError naming it."""
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False, headers=headers) as client:
        facts = [await probe(client, u) for u in urls]
        found = differences(facts, ignore)
        safe = _fingerprint_is_safe(facts, found)
        if safe and FINGERPRINT not in ignore:
            name = clients_name(facts, model)
            for fact, url in zip(facts, urls, strict=True):
                fact.probed_as = name or fact.model_id
                fact.fingerprint = await fingerprint.take(client, fact.url, fact.probed_as)
                await _still_answers(client, url, facts)
            found = differences(facts, ignore)
    said = notes(facts, fingerprinted=safe and FINGERPRINT not in ignore)
    if not safe and FINGERPRINT not in ignore:
        said.append("numerics not compared behaviourally: the facts already differ and the "
                    "instances run a KV connector, so no probe was sent that one might load "
                    "from another's KV")
    return Compatibility(facts, found, said, store_faults(facts))


def _fingerprint_is_safe(facts: list[InstanceFacts], found: list[Mismatch]) -> bool:
    """Whether the fingerprint's prompt may go to every instance: none reads KV another
    wrote (every one reports no KV connector; unknown counts as one), or the facts agree and
    no store holds a partial entry."""
    if all(f.connector == "none" for f in facts):
        return True
    return not found and store_faults(facts) == []


async def _still_answers(client: httpx.AsyncClient, url: str,
                         facts: list[InstanceFacts]) -> None:
    """UnreachableError when the instance at `url` stopped answering during the check."""
    try:
        alive = (await client.get(server_root(url) + "/health")).status_code < 500
    except httpx.HTTPError:
        alive = False
    if not alive:
        others = ", ".join(f.url for f in facts if f.url != api_base(url))
        raise UnreachableError(
            f"instance {api_base(url)} died during the check, after its fingerprint probe "
            f"(one prompt also sent to {others or 'no other instance'}): see its log for the "
            "cause; an instance that reads another's KV store dies loading KV it cannot use")


def store_faults(instances: list[InstanceFacts]) -> list[str]:
    """Why a store the instances name (on this machine) cannot be served: a partial entry."""
    named = {(p, store) for f in instances if (store := store_for(f.connector)) is not None
             for p in store.named(f.kv_store)}
    return [why for path, store in sorted(named, key=lambda n: n[0])
            if (why := store.partial(path)) is not None]


async def check(urls: list[str], *, ignore: tuple[str, ...] = (), timeout_s: float = 20.0,
                headers: dict[str, str] | None = None,
                model: str | None = None) -> list[InstanceFacts]:
    """Probe every instance and refuse (RefusedError) if any compared field differs, or if a
    store they share on this machine holds a partial entry (`engines/registry.store_for`);
    `model` is the name clients send (the fingerprint's probe goes under it)."""
    result = await compare(urls, ignore=ignore, timeout_s=timeout_s, headers=headers,
                           model=model)
    if not result.compatible:
        raise RefusedError(result.refusal())
    return result.instances
