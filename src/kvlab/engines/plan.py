"""An engine plan: everything needed to start one engine process, as data; and the request a
plan is made from.

A plan is built by an engine's adapter (`Engine.plan`: `engines/vllm/plans.py`,
`engines/llamacpp/facts.py`, `engines/mlx/`) from settings, a role and a `PlanRequest`; the
process runner (`process.py`) renders argv from it and never parses argv back. Secrets kvlab
holds are not part of a plan: they are added to the child's environment at spawn time only.
A secret the user passes to the engine (`-- --api-key sk-...`) is in the plan, so every view
of it (`argv()`, `shell_line()`, `as_dict()`) shows `<redacted>` in its place: the value of a
secret-bearing flag, and any value equal to one of the plan's `secret_values` (the secrets
settings know). Only `exec_argv()`, what the process runner spawns, carries the real value.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace

from kvlab.core import (
    REDACTED,
    HostMemory,
    is_secret_name,
    redact_argv,
    redact_text,
    secret_flag_values,
)
from kvlab.records import StartupFacts


@dataclass(frozen=True)
class PlanRequest:
    """What an experiment or a command asks of one instance beyond the settings, in the lab's
    words; each engine's adapter says which fields it honours (`Engine.plan_fields`) and the
    registry refuses a request that sets one it does not."""

    # every engine
    model: str | None = None  # the model to serve (default: the settings')
    cache_server_port: int | None = None  # the ZeroMQ port of the LMCache server a pair
    # shares, on this machine (the first of the pair starts it; default 5555, LMCache's own),
    # or of another plan's server its host tier uses (default: one of its own, on free ports)
    port: int | None = None  # (default: the role's port setting)
    extra_args: tuple[str, ...] = ()  # after `--`, passed unchanged and winning
    store_path: str | None = None  # where KV it shares or saves lives (KV_SHARED_PATH or the
    # slot directory, LLAMA_SLOT_SAVE_PATH)
    # vLLM
    share_with: str | None = None  # the shared roles' connector: `shared` (ExampleConnector,
    # the seed's; the default), `lmcache` (one LMCache server, found by prefix) or `fs` (vLLM's
    # fs tier on one directory, found by prefix)
    host_tier: bool | None = None  # override OFFLOAD for the offload role
    host_tier_gib: float | None = None  # the host tier's size (default: KV_OFFLOAD_GB)
    disk_tier_path: str | None = None  # a disk tier under the host tier, on this directory
    device_cache_bytes: int | None = None  # its device KV cache (default: KV_CACHE_BYTES)
    memory_fraction: float | None = None  # its share of the device (default: the role's)
    host_memory: HostMemory | None = None  # None: measured when a host-tier plan is made
    cpu_core: int | None = None  # pin a CPU build's threads to one core
    enforce_eager: bool | None = None
    monolithic_switch: bool = False  # honour MONOLITHIC as serve-decode.sh does (kvlab serve)
    # the user's store must already exist (kvlab serve): a writer that created it would hide
    # an unmounted share; an experiment's own store is made at start
    store_must_exist: bool = False
    interfaces: Mapping[str, tuple[str, ...]] | None = None  # None: this machine's
    # the store is checked on this machine; False: on a cluster's nodes' mount, which the
    # run checks there (a cluster dry run's plans)
    store_here: bool = True
    # read the engine's own --help where the plan depends on it (a start; a dry run shows the
    # plan without spending the time)
    probe_flags: bool = False
    # llama-server
    slots: int | None = None  # parallel sequences (default: the settings')
    kv_cache_type: str | None = None  # the KV cache's element type, K and V alike
    host_cache_mib: int | None = None  # an in-RAM prompt cache of this size (0: none)
    prefix_caching: bool = True  # False: no request reuses a cached prefix
    log_cache_state: bool = False  # log the prompt cache's state on every change

    def set_fields(self) -> frozenset[str]:
        """The fields given a value other than their default."""
        return frozenset(f.name for f in fields(self) if getattr(self, f.name) != f.default)


def client_host(bind_host: str) -> str:
    """Where a client on this machine reaches a server bound to `bind_host`."""
    wildcard = ("0.0.0.0", "::", "")  # noqa: S104 - recognising a wildcard, not binding one
    return "127.0.0.1" if bind_host in wildcard else bind_host


@dataclass(frozen=True)
class Flag:
    """One command-line option: `--name value`, or a bare switch when value is None."""

    name: str
    value: str | None = None

    def render(self) -> list[str]:
        return [self.name] if self.value is None else [self.name, self.value]


@dataclass(frozen=True)
class EnginePlan:
    """One engine instance to start, described completely."""

    engine: str  # "vllm" or "llama.cpp"
    role: str
    command: tuple[str, ...]  # the program and its subcommand, e.g. ("vllm", "serve")
    positional: tuple[str, ...] = ()
    flags: tuple[Flag, ...] = ()
    extra_args: tuple[str, ...] = ()  # given by the user after `--`, passed unchanged
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0
    health_path: str = "/health"
    private_dirs: tuple[str, ...] = ()  # created 0700 before start: they will hold prompts
    summary: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    host_tier: bool = False  # the engine gets a host-memory KV tier under its own cache
    model: str = ""
    served_name: str = ""
    # what kvlab chose while planning (which build and why, flags beyond the seed script,
    # measured host figures): the startup record carries it
    startup_facts: StartupFacts = field(default_factory=StartupFacts)
    # kvlab's own flags left out because the arguments after `--` set them too
    given_way: tuple[Flag, ...] = ()
    # secrets settings know (HF_TOKEN, the servers' API key): never shown in any view
    secret_values: frozenset[str] = field(default_factory=frozenset, repr=False)
    # processes this engine needs running before it starts, stopped after it (the LMCache
    # server that holds its host tier): started, recorded and stopped by the host
    companions: tuple[EnginePlan, ...] = ()

    def exec_argv(self) -> list[str]:
        """The real command line, secrets included: for spawning the process, nothing else."""
        args = [*self.command, *self.positional]
        for flag in self.flags:
            args.extend(flag.render())
        return [*args, *self.extra_args]

    def with_facts(self, **facts: object) -> EnginePlan:
        """The plan with more of what kvlab chose (`StartupFacts` fields, validated) for its
        startup line."""
        merged = {**self.startup_facts.model_dump(exclude_none=True), **facts}
        return replace(self, startup_facts=StartupFacts.model_validate(merged))

    def argv(self) -> list[str]:
        """The command line to show and record: secret values replaced by `<redacted>`."""
        return redact_argv(self.exec_argv(), self.secret_values)

    def own_argv(self) -> list[str]:
        """The command line as kvlab alone would have run it (no arguments after `--`, and
        the flags they replaced back in place), secrets redacted."""
        args = [*self.command, *self.positional]
        for flag in (*self.flags, *self.given_way):
            args.extend(flag.render())
        return redact_argv(args, self.secret_values)

    def secrets(self) -> frozenset[str]:
        """Every secret this plan holds: the known values and those given to secret flags."""
        return frozenset({*self.secret_values, *secret_flag_values(self.exec_argv())} - {""})

    def with_secrets(self, values: Iterable[str]) -> EnginePlan:
        """This plan, with `values` (secrets from settings) hidden from every view of it."""
        return replace(self, secret_values=self.secret_values | {v for v in values if v})

    def shown_env(self) -> dict[str, str]:
        """The plan's environment to show and record, secret values redacted."""
        return {k: REDACTED if is_secret_name(k) else redact_text(v, self.secret_values)
                for k, v in sorted(self.env.items())}

    def flag_value(self, name: str) -> str | None:
        """The value of `name` in this plan (None if absent or a bare switch)."""
        for flag in self.flags:
            if flag.name == name:
                return flag.value
        return None

    def has_flag(self, name: str) -> bool:
        return any(flag.name == name for flag in self.flags) or name in self.extra_args

    @property
    def client_host(self) -> str:
        """Where a client on this machine reaches the server (a wildcard bind is loopback)."""
        return client_host(self.host)

    @property
    def base_url(self) -> str:
        """The server root, e.g. http://127.0.0.1:8200 (OpenAI routes are under /v1)."""
        return f"http://{self.client_host}:{self.port}"

    @property
    def health_url(self) -> str:
        return self.base_url + self.health_path

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    def shell_line(self) -> str:
        """The command line as one copy-pasteable string, with its environment."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.shown_env().items())
        cmd = " ".join(shlex.quote(a) for a in self.argv())
        return f"{env} {cmd}".strip()

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready view for `--dry-run --json` and notebook records."""
        return {
            "engine": self.engine,
            "role": self.role,
            "argv": self.argv(),
            "env": self.shown_env(),
            "host": self.host,
            "port": self.port,
            "base_url": self.base_url,
            "health_url": self.health_url,
            "private_dirs": list(self.private_dirs),
            "model": self.model,
            "served_name": self.served_name,
            "host_tier": self.host_tier,
            "notes": list(self.notes),
            "startup_facts": self.startup_facts.model_dump(mode="json", exclude_none=True),
            "companions": [{**c.as_dict(), "shell": c.shell_line()} for c in self.companions],
        }
