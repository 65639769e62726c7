"""The engine adapter: what the rest of kvlab may ask of an engine, without naming it.

Each engine package (`engines/vllm`, `engines/llamacpp`) provides one `Engine`; everything
outside `engines/` reaches an engine through `registry.engine_for(name)` or
`registry.source_of(snapshot)` (and the evidence deltas of a scrape through
`registry.evidence_deltas`), and never compares engine names itself. An adapter answers from
data its package pins (metric names, log formats, endpoints) and from the running server
(version, identity facts).

Deliberately not here: starting processes (`process.py`, any plan), installing engines
(`install.py`), and the per-engine plans, whose options differ too much to share a signature.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kvlab.core import is_secret_name
from kvlab.observe import CounterTable, GaugeTable, Snapshot
from kvlab.records import EngineArgs, InstanceLine, KvCapacity

if TYPE_CHECKING:
    import httpx

    from kvlab.core import Say, Settings
    from kvlab.engines.plan import EnginePlan
    from kvlab.observe import ChatResult, Fingerprint

VLLM = "vllm"
LLAMA_CPP = "llama.cpp"  # the one spelling, in plans, records and load rows
NAMES = (VLLM, LLAMA_CPP)
# other spellings met at the boundary: Part 9's load-test.py takes `--engine llamacpp`
ALIASES = {"llamacpp": LLAMA_CPP}


def canonical_name(name: str) -> str:
    """The one spelling of an engine name given in any accepted spelling."""
    return ALIASES.get(name, name)

# the conversation every instance templates and tokenises for the compatibility check:
# markup, a tab, a newline, non-ASCII and an emoji, where tokenisers and templates differ
PROBE_MESSAGES = [
    {"role": "system", "content": "You check that two engines agree, token for token."},
    {"role": "user", "content": "Does 3 + 4 = 7? Answer with one word: {yes|no}."},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "And «7 × 6»? Émoji ok: 🙂 — tabs\tand newlines\nalso."},
]

__all__ = ["NAMES", "CounterTable", "Engine", "GaugeTable", "InstanceFacts", "Support"]


@dataclass(frozen=True)
class Support:
    """Whether an install can do a thing here, and if not, why (said in a not-run line)."""

    ok: bool
    reason: str = ""


@dataclass
class InstanceFacts:
    """What one running instance says about itself (compared by `kvlab check`).

    From the server: identity (/v1/models, version), cache config, template tokens. From this
    machine, when the instance runs here: what its command line says (`argv_facts`: dtype,
    quantisation, KV type, numerics flags, store) and what its model files hold
    (`content_digest`). Fields left None are unknown, never guessed.
    """

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
    memory_fraction: float | None = None  # as its /metrics states it (vLLM's cache config)
    template_tokens: list[int] | None = None
    content_digest: str | None = None  # config + tokenizer + sampled weights, path-free
    dtype: str | None = None  # the weights' compute dtype as started (None: unknown/auto)
    quantization: str | None = None
    numerics_flags: str | None = None  # other flags that change the numbers (rope, overrides)
    kv_store: str | None = None  # what it shares KV through: connector and store path
    connector: str | None = None  # the KV connector it runs ("none" without one)
    kv_role: str | None = None  # its connector's role: kv_producer, kv_consumer, kv_both
    fingerprint: Fingerprint | None = None
    notes: list[str] = field(default_factory=list)
    listed_models: list[str] = field(default_factory=list)  # every id /v1/models lists

    def as_record(self) -> InstanceLine:
        """The facts for a notebook line (the template tokens as a count and a digest)."""
        template = (f"{len(self.template_tokens)} tokens, sha "
                    + token_digest(self.template_tokens)) if self.template_tokens is not None \
            else None
        return InstanceLine(
            url=self.url, engine=self.engine, version=self.version, model_id=self.model_id,
            root=self.root, max_model_len=self.max_model_len, block_size=self.block_size,
            cache_dtype=self.cache_dtype, prefix_caching=self.prefix_caching,
            kv_cache_tokens=self.kv_cache_tokens, template_tokens=template,
            content_digest=self.content_digest, dtype=self.dtype, quantization=self.quantization,
            numerics_flags=self.numerics_flags, kv_store=self.kv_store,
            connector=self.connector, kv_role=self.kv_role,
            fingerprint=self.fingerprint.as_record() if self.fingerprint else None,
            notes=list(self.notes))


@dataclass(frozen=True)
class LaunchSettings:
    """What a startup line states about how the instance was sized."""

    context_tokens: int | None = None
    memory_fraction: float | None = None
    block_size: int | None = None  # as asked on the command line (None: the engine's default)
    slots: int | None = None  # llama-server's --parallel


def flag_value(argv: list[str], *names: str) -> str | None:
    """The value of the LAST of `names` in an argv (`--flag value` or `--flag=value`), as the
    engines' parsers take it: extra arguments after kvlab's own flags win."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def has_flag(argv: list[str], name: str) -> bool:
    """Whether a switch (`--flag`, or `--flag=...`) is on the command line."""
    return any(arg == name or arg.startswith(name + "=") for arg in argv)


def _is_flag(arg: str) -> bool:
    return arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit()


def argv_args(argv: Sequence[str], aliases: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every flag of a command line by its name (`--max-num-batched-tokens 512` as
    `max_num_batched_tokens: 512`; a bare switch "True", `--no-x` as `x: False`), the last
    one winning, as the engines' parsers take them. `aliases` maps short spellings to long
    ones (llama.cpp's `-c` is `--ctx-size`). Words that are no flag's value are skipped;
    secret-bearing flags are left out."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not _is_flag(arg):
            continue
        name, eq, value = arg.partition("=")
        name = (aliases or {}).get(name, name)
        if not eq:
            if i < len(argv) and not _is_flag(argv[i]):
                value, i = argv[i], i + 1
            else:
                value = "True"
        key = name.lstrip("-").replace("-", "_")
        if key.startswith("no_") and value == "True":
            key, value = key[3:], "False"
        if not is_secret_name(key):
            out[key] = value
    return out


def config_word(text: str | None, key: str) -> str | None:
    """One string field of a connector config as a command line (JSON) or a log (a repr)
    spells it: `"kv_role":"kv_producer"` or `kv_role='kv_producer'`."""
    if not text:
        return None
    found = re.search(rf"""{key}['"]?\s*[:=]\s*['"]([\w.-]+)""", text)
    return found.group(1) if found else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def launch_settings_from(argv: list[str], ctx_flags: tuple[str, ...],
                         fraction_flag: str | None, block_flags: tuple[str, ...] = (),
                         slot_flags: tuple[str, ...] = ()) -> LaunchSettings:
    """An engine's LaunchSettings, read with that engine's flag names (the last one wins)."""
    ctx = flag_value(argv, *ctx_flags)
    fraction = flag_value(argv, fraction_flag) if fraction_flag else None
    block = flag_value(argv, *block_flags) if block_flags else None
    slots = flag_value(argv, *slot_flags) if slot_flags else None
    return LaunchSettings(_int(ctx), _float(fraction), _int(block), _int(slots))


def token_list(body: dict[str, object] | None) -> list[int] | None:
    """The "tokens" list of a /tokenize answer (both engines name it so), or None."""
    tokens = body.get("tokens") if body else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens


def token_digest(tokens: list[int]) -> str:
    """A short digest of a token list, to show that two lists differ."""
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:12]


class Asked(Protocol):
    """One case as the runner recorded it; only its answer is read here."""

    @property
    def result(self) -> ChatResult: ...


class CaseRunner(Protocol):
    """What `kvlab prove`'s case runner offers an engine's own two-endpoint proof."""

    say: Say

    @property
    def nonce(self) -> str:
        """The run's nonce: its prompts open with it, so nothing else shares them."""
        ...

    async def cold(self, name: str, url: str, **extra: object) -> Asked:
        """The run's prompt, the first time anywhere."""
        ...

    async def identical(self, name: str, url: str, why: str, **extra: object) -> Asked:
        """The run's prompt again: every reusable token is expected from cache."""
        ...

    async def control(self, name: str, url: str, why: str, **extra: object) -> Asked:
        """The same length with other first words: nothing cached can match it."""
        ...

    def explain(self, text: str) -> None:
        """Add a sentence to the proof's explanations."""
        ...


class TwoEndpointProof(Protocol):
    """An engine's own proof that two of its instances share KV, run through prove's cases."""

    async def __call__(self, runner: CaseRunner, a: str, b: str, settings: Settings) -> None:
        ...


class Engine(Protocol):
    """One engine's answers, as data and small async probes."""

    name: str
    metric_namespace: str  # the prefix of its /metrics names, e.g. "vllm" in vllm:...
    counters: CounterTable
    gauges: GaugeTable
    transfer_counters: CounterTable  # KV moved between instances (NIXL's bytes), if any
    api_key_env: str  # the variable the server takes its API key from (kept out of argv)
    address_env: tuple[str, ...]  # variables holding the address the engine advertises
    # the engine's own proof that two instances share KV; None: prove's generic cases apply
    two_endpoint_proof: TwoEndpointProof | None

    def capacity(self, plan: EnginePlan, log_text: str) -> KvCapacity:
        """KV capacity fields from the startup log (empty when none were found)."""
        ...

    def block_size(self, platform: str) -> int:
        """Tokens per KV block the prefix cache works in, on this platform."""
        ...

    def launch_settings(self, argv: list[str]) -> LaunchSettings:
        """The context length and memory fraction an instance was started with, from its argv."""
        ...

    # arguments two compared instances may differ in: where they listen and the variable
    # kvlab's experiments change (the connector, the tier), by `effective_args`' names
    variable_args: frozenset[str]

    def effective_args(self, log_text: str | None, argv: list[str] | None) -> EngineArgs | None:
        """The instance's effective arguments: from its startup log where the engine logs
        them, else from its command line (None: neither said anything)."""
        ...

    def unread_content(self, root: str) -> dict[tuple[str, str], str]:
        """Parts of a model directory's files this engine does not read, as (file, key) ->
        why: a difference there is a note, not a refusal."""
        ...

    def connector_of(self, args: EngineArgs) -> tuple[str, str | None]:
        """(the lab's name of the KV connector the arguments run, "none" without one; its
        KV role, None without one)."""
        ...

    async def version(self, client: httpx.AsyncClient, root: str) -> str | None:
        """The running server's own version string (None when it does not say)."""
        ...

    def version_note(self, version: str) -> str | None:
        """A note when `version` is not the build kvlab's facts for the engine are pinned
        for (None: it is, or the engine pins none)."""
        ...

    async def describe(self, client: httpx.AsyncClient, root: str, facts_out: InstanceFacts,
                       snap: Snapshot | None) -> bool:
        """Fill `facts_out` from the server; False when the server is not this engine."""
        ...

    def cache_size(self, snap: Snapshot) -> int | None:
        """The KV cache's size in tokens as the engine's own /metrics states it (None: not
        exposed), for instances kvlab did not start and so has no startup line for."""
        ...

    async def tokenize(self, client: httpx.AsyncClient, root: str, text: str) -> list[int] | None:
        """`text` in the served model's tokens, without special tokens, by the server's own
        tokenizer endpoint (None: the server has none, or it did not answer)."""
        ...

    async def detokenize(self, client: httpx.AsyncClient, root: str, model: str,
                         tokens: list[int]) -> str | None:
        """`tokens` of the served model (`model`) as text, by the server's own detokenizer
        endpoint (None: the server has none, or it did not answer)."""
        ...
