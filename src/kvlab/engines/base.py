"""The engine adapter: what the rest of kvlab may ask of an engine, without naming it.

Each engine package (`engines/vllm`, `engines/llamacpp`, `engines/mlx`) provides one
`Engine`; everything outside `engines/` reaches an engine through the registry
(`registry.engine_for(name)`, `registry.source_of(snapshot)`, `registry.make_plan(...)`) and never
compares engine names itself. An adapter answers from data its package pins (metric names,
log formats, endpoints), from its install (`Install`: which build runs here, and what it can
do), and from the running server (version, identity facts).

Deliberately not here: starting processes (`process.py`), installing engines (`install.py`),
reading command lines (`argv.py`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import ConfigDict, Field

from kvlab.core import EngineError, human_bytes
from kvlab.observe import CounterTable, Fingerprint, GaugeTable, Snapshot
from kvlab.records import EngineArgs, EngineChoice, InstanceLine, InstanceStated, KvCapacity

if TYPE_CHECKING:
    import httpx

    from kvlab.core import Say, Settings
    from kvlab.engines.plan import EnginePlan, PlanRequest
    from kvlab.observe import ChatResult


# the conversation every instance templates and tokenises for the compatibility check:
# markup, a tab, a newline, non-ASCII and an emoji, where tokenisers and templates differ
PROBE_MESSAGES = [
    {"role": "system", "content": "You check that two engines agree, token for token."},
    {"role": "user", "content": "Does 3 + 4 = 7? Answer with one word: {yes|no}."},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "And «7 × 6»? Émoji ok: 🙂 — tabs\tand newlines\nalso."},
]

__all__ = ["CounterTable", "DeviceRules", "Engine", "GaugeTable", "InstanceFacts", "Support"]


@dataclass(frozen=True)
class Support:
    """Whether an install can do a thing here, and if not, why (said in a not-run line)."""

    ok: bool
    reason: str = ""


# what an experiment may ask an install whether it can do (`Install.supports`)
HOST_TIER = "host-tier"  # a host-memory KV tier under the engine's own cache
DISK_TIER = "disk-tier"  # a disk tier of its own under that (vLLM's fs tier)
FEATURES = (HOST_TIER, DISK_TIER)


@dataclass(frozen=True)
class RamShape:
    """A slot server's in-RAM prompt cache under its slots (llama-server's `--cache-ram`), as
    its command line sets it: the byte limit (0: none), the token limit (the server's whole
    context), whether idle slots are saved on each request and whether saving clears them (a
    unified KV cache), and what a saved token's bytes follow (the model file, K and V types)."""

    limit_bytes: int
    limit_tokens: int
    save_idle: bool
    unified: bool
    model_file: str | None
    kv_types: tuple[str, str]


@dataclass(frozen=True)
class CacheShape:
    """How an engine's prefix cache holds prompts, as the cache oracle replays it: `blocks`,
    an LRU of whole blocks shared by every request (vLLM); `slots`, sequences that each keep
    the prompt they last held (llama-server), with the RAM cache under them (`ram`; None with
    `ram_unknown` saying why, where the server's command line could not be read)."""

    kind: Literal["blocks", "slots"]
    sizes_from: str  # where the figures were read
    block_tokens: int = 1
    blocks: int = 0  # blocks that can hold a prompt (`blocks`)
    slots: int = 0  # (`slots`)
    ram: RamShape | None = None
    ram_unknown: str | None = None


@dataclass(frozen=True)
class DeviceRules:
    """What one instance holds on its device beside its weights and its KV cache, as the
    engine's own facts have it: the tokens of its largest forward pass (whose activations
    peak at once) and a fixed part (memory outside the framework's allocator), both within
    the share the engine is given (vLLM's --gpu-memory-utilization); its CUDA context and,
    where it compiles, its CUDA graphs, beside that share; and the part of the device no
    engine gets."""

    batched_tokens: int
    fixed_bytes: int
    context_bytes: int
    graph_bytes: int  # 0 where it runs eager
    reserve_bytes: int
    compiled: bool
    basis: str  # where the figures come from, in a sentence


@dataclass(frozen=True)
class Room:
    """The store's filesystem against what a run will write into it."""

    store: Path
    free_bytes: int
    predicted_bytes: int
    requests: int
    bytes_per_request: float

    @property
    def enough(self) -> bool:
        return self.free_bytes >= self.predicted_bytes

    def refusal(self) -> str:
        return (f"the KV store's filesystem is too small for this run: {self.store} has "
                f"{human_bytes(self.free_bytes)} free and the run keeps up to about "
                f"{human_bytes(self.predicted_bytes)} there at once ({self.requests} requests x "
                f"{human_bytes(int(self.bytes_per_request))} of KV each, from the model's "
                "shape); an engine that meets a full store dies mid-write and leaves a partial "
                "entry: free space there, point the store at a larger filesystem, or send "
                "fewer requests")


@dataclass(frozen=True)
class StoreMatch:
    """A store's own entries set against what its connector's rule names for some prompts:
    the entry each would be stored as, and the one each would look for."""

    entries: list[str]  # the store's entries, oldest first
    stored: list[str]  # per prompt: the entry its KV is written to
    sought: list[str]  # per prompt: the entry its lookup needs

    def held(self, i: int) -> bool:
        """Whether prompt i's stored entry is in the store."""
        return self.stored[i] in self.entries

    def found(self, i: int) -> bool:
        """Whether prompt i's lookup finds an entry."""
        return self.sought[i] in self.entries


class KvStore(Protocol):
    """A KV store on disk that instances share (the shared connector's directory): its
    entries, whether one is cut short, and the room a run needs."""

    def drain(self, store: Path) -> tuple[int, int]:
        """Remove the store's entries (nothing else kept there); how many went, their bytes."""
        ...

    def partial(self, store: Path, layers: int | None = None) -> str | None:
        """Why `store` must not be served (it holds an entry an engine dies loading, or takes
        no write), or None."""
        ...

    def named(self, kv_store: str | None) -> list[Path]:
        """The store directories an instance's `kv_store` fact names."""
        ...

    def require_room(self, store: Path, requests: int, bytes_per_request: float) -> Room:
        """The room `requests` entries need, refused (RefusedError) when it is not there."""
        ...

    def match(self, store: Path, prompts: Sequence[Sequence[int]], block: int) -> StoreMatch:
        """The connector's matching rule checked on the store's own entries for these
        prompts' token ids (the instance's `block`-token cache blocks)."""
        ...


@dataclass(frozen=True)
class ProgramInstall:
    """An install that is one program on this machine (None: not found, and `reason` says the
    fix), for the engines whose build is a binary or an interpreter kvlab finds or makes."""

    program: Path | None
    platform: str  # the device its build targets: "cpu", "cuda", "rocm" or "metal"
    reason: str

    @property
    def found(self) -> bool:
        return self.program is not None

    def require(self) -> None:
        if self.program is None:
            raise EngineError(self.reason)


class Install(Protocol):
    """Which build of an engine runs on this machine, on what, and why this one."""

    @property
    def found(self) -> bool: ...

    @property
    def reason(self) -> str:
        """Why this build (or why none was found, with the fix)."""
        ...

    @property
    def platform(self) -> str:
        """"cpu", "cuda", "rocm" or "metal": the device its KV cache lives on."""
        ...

    def require(self) -> None:
        """Refuse to start when no build is available (EngineError naming the fix)."""
        ...

    def supports(self, feature: str) -> Support:
        """Whether this build can do `feature` (one of FEATURES) here, and if not, why."""
        ...

    def accepted_flags(self, cache_dir: Path) -> frozenset[str] | None:
        """Every flag the build's own --help lists (cached under `cache_dir`; None: it
        cannot say)."""
        ...

    def as_record(self) -> EngineChoice:
        """The choice as a startup line and `kvlab settings` state it."""
        ...


class InstanceFacts(InstanceStated):
    """What one running instance says about itself (compared by `kvlab check`).

    From the server: identity (/v1/models, version), cache config, template tokens. From this
    machine, when the instance runs here: what its command line says (`argv_facts`: dtype,
    quantisation, KV type, numerics flags, store) and what its model files hold
    (`content_digest`). Fields left None are unknown, never guessed. Filled in step by step,
    each assignment taken as given.
    """

    model_config = ConfigDict(validate_assignment=False)

    template_tokens: list[int] | None = None
    memory_fraction: float | None = None  # as its /metrics states it (vLLM's cache config)
    fingerprint: Fingerprint | None = None
    notes: list[str] = Field(default_factory=list)
    listed_models: list[str] = Field(default_factory=list)  # every id /v1/models lists

    def as_record(self) -> InstanceLine:
        """The facts for a notebook line (the template tokens as a count and a digest)."""
        template = (f"{len(self.template_tokens)} tokens, sha "
                    + token_digest(self.template_tokens)) if self.template_tokens is not None \
            else None
        stated = {name: getattr(self, name) for name in InstanceStated.model_fields}
        return InstanceLine.model_validate({
            **stated, "template_tokens": template, "notes": list(self.notes),
            "fingerprint": self.fingerprint.as_record() if self.fingerprint else None})


@dataclass(frozen=True)
class LaunchSettings:
    """What a startup line states about how the instance was sized."""

    context_tokens: int | None = None
    memory_fraction: float | None = None
    block_size: int | None = None  # as asked on the command line (None: the engine's default)
    slots: int | None = None  # llama-server's --parallel


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

    name: str  # the one spelling, in plans, records and load rows
    aliases: tuple[str, ...]  # other spellings met at the boundary (load-test.py's --engine)
    roles: tuple[str, ...]  # the lab roles it plans (`kvlab serve ROLE`)
    titles: Mapping[str, str]  # each role in a few words (`kvlab serve`'s banner)
    plan_fields: frozenset[str]  # the PlanRequest fields it honours
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

    # --- installing, planning and pooling --------------------------------------------------
    def install(self, settings: Settings) -> Install:
        """The build this machine runs, chosen from the settings and the hardware."""
        ...

    def prepare(self, settings: Settings, say: Say) -> None:
        """Install the build this machine's device takes where kvlab makes it and none is
        there (EngineError when that fails); say what cannot be had here."""
        ...

    short: str  # its name in `kvlab engines install --only NAME`

    def build(self, settings: Settings, say: Say, asked: bool) -> Path | None:
        """Install kvlab's own build of the engine for this machine's device (`kvlab engines
        install`); where it has none, EngineError when `asked` for by name, else say so and
        return None."""
        ...

    def missing(self, settings: Settings) -> str | None:
        """What the labs need that the settings do not give it (a model of its format), and
        how to give it (None: nothing)."""
        ...

    def device_rules(self, settings: Settings) -> DeviceRules | None:
        """What an instance planned with these settings holds beside its weights and cache,
        where the engine takes a planned device cache (None: it sizes its own)."""
        ...

    def memory_failure(self, log_text: str) -> str | None:
        """The line of a dead instance's log that says its start failed for want of device
        memory, in the engine's own words (None: it did not)."""
        ...

    def plan(self, settings: Settings, role: str, install: Install,
             request: PlanRequest | None = None) -> EnginePlan:
        """The plan for one instance in `role` (RefusedError naming what is wrong)."""
        ...

    tier_gauges: GaugeTable  # what its host tier reports while it runs (sampled by the lab)

    def resettable(self, plan: EnginePlan) -> bool:
        """Whether a reset empties every cache the plan's instance has, so a kept instance
        can serve the next step clean (`engines/reuse.py`)."""
        ...

    def poolable(self, plan: EnginePlan) -> EnginePlan:
        """`plan` as a pooled pass starts it (with its reset route served, where it needs
        one)."""
        ...

    async def cached_probe(self, client: httpx.AsyncClient, plan: EnginePlan,
                           prompt: str) -> tuple[int, int]:
        """(prompt tokens, cached tokens) of one one-token completion of `prompt`."""
        ...

    async def reset_cache(self, client: httpx.AsyncClient, plan: EnginePlan) -> str:
        """Empty the instance's prefix cache; the method, as sent."""
        ...

    # --- what the oracle replays ----------------------------------------------------------
    async def tokenize_chat(self, client: httpx.AsyncClient, root: str, model: str,
                            messages: list[dict[str, str]]) -> list[int] | None:
        """A chat request's tokens as the server counts them, its template applied (None: it
        cannot say)."""
        ...

    async def cache_shape(self, client: httpx.AsyncClient, root: str,
                          snap: Snapshot | None) -> CacheShape | None:
        """The prefix cache's layout and size as the server states it (None: it does not)."""
        ...
