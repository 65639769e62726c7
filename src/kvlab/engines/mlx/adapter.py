"""mlx-lm's server as kvlab's `Engine`: what it can answer, and what it cannot.

mlx_lm.server speaks OpenAI's routes and reports `usage.prompt_tokens_details.cached_tokens`
per response, the evidence of reuse across turns; it has no /metrics, no /tokenize, no
/version and no route that empties its prompt cache, so those answers are empty (None, no
counters), never guessed. It is recognised by the command line of the process listening on its
port, where the instance runs on this machine.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import httpx

from kvlab.core import EngineError, Say, Settings, detect_hardware, wants_gpu
from kvlab.engines import install, local
from kvlab.engines.argv import argv_args
from kvlab.engines.base import (
    HOST_TIER,
    CacheShape,
    CounterTable,
    DeviceRules,
    GaugeTable,
    Install,
    InstanceFacts,
    LaunchSettings,
    ProgramInstall,
    Support,
    TwoEndpointProof,
)
from kvlab.engines.http import openai_cached
from kvlab.engines.mlx.server import MLX_LM, ROLE, SUBCOMMAND, server_plan
from kvlab.engines.plan import EnginePlan, PlanRequest
from kvlab.records import EngineArgs, EngineChoice, KvCapacity

if TYPE_CHECKING:
    from kvlab.observe import Snapshot

NO_TIER = ("mlx-lm keeps its prompt cache in the process (and in a file, the disk tier); it has "
           "no host-memory tier under a device cache")
NOT_INSTALLED = ("mlx-lm is not installed on this machine: `kvlab engines install --only mlx` "
                 "puts it in a venv of its own (mlx[cpu] on Linux, mlx with Metal on macOS)")
ON_GPU = ("mlx-lm is Apple's engine, and on this GPU machine kvlab would install only its CPU "
          "build: `kvlab engines install --only mlx` puts it in anyway, and then `kvlab run "
          "all` times it")


@dataclass(frozen=True)
class MlxInstall(ProgramInstall):
    """The interpreter of kvlab's mlx-lm venv (None: not installed); its platform "metal" on a
    Mac, else "cpu" (mlx's Linux wheels)."""

    def supports(self, feature: str) -> Support:
        return Support(False, NO_TIER if feature == HOST_TIER
                       else f"mlx-lm has no {feature!r} kvlab knows")

    def accepted_flags(self, cache_dir: Path) -> frozenset[str] | None:
        return None  # kvlab passes it only --model, --host and --port

    def as_record(self) -> EngineChoice:
        return EngineChoice(command=f"{self.program or 'python'} {' '.join(SUBCOMMAND)}",
                            origin="kvlab venv" if self.program else "not found",
                            platform=self.platform, reason=self.reason)


def _is_mlx_server(argv: list[str] | None) -> bool:
    return argv is not None and "mlx_lm" in argv and "server" in argv


class MlxEngine:
    name = MLX_LM
    aliases: tuple[str, ...] = ()
    roles: tuple[str, ...] = (ROLE,)
    titles: Mapping[str, str] = MappingProxyType({ROLE: "mlx-lm's server"})
    plan_fields = frozenset({"model", "port"})
    metric_namespace = ""  # no /metrics
    api_key_env = ""  # it takes no API key
    address_env: tuple[str, ...] = ()
    variable_args = frozenset({"port", "host"})

    def __init__(self) -> None:
        self.counters: CounterTable = {}
        self.gauges: GaugeTable = {}
        self.transfer_counters: CounterTable = {}
        self.tier_gauges: GaugeTable = {}
        self.two_endpoint_proof: TwoEndpointProof | None = None

    def install(self, settings: Settings) -> Install:
        python = install.mlx_python(settings.home())
        device = "metal" if platform.system() == "Darwin" else "cpu"
        why = ON_GPU if wants_gpu(settings, detect_hardware()) else NOT_INSTALLED
        return MlxInstall(python, device, str(python) if python else why)

    def prepare(self, settings: Settings, say: Say) -> None:
        """mlx-lm in its own venv, except on a GPU machine (its CPU build would time the wrong
        device)."""
        if install.mlx_python(settings.home()) is not None:
            return
        if wants_gpu(settings, detect_hardware()):
            say(f"mlx-lm: {ON_GPU}; its rows are recorded as not run")
        else:
            install.install_mlx(settings.home(), say)

    short = "mlx"

    def build(self, settings: Settings, say: Say, asked: bool) -> Path | None:
        """mlx-lm in its own venv (its CPU build on Linux, Metal's on macOS)."""
        return install.install_mlx(settings.home(), say)

    def missing(self, settings: Settings) -> str | None:
        return None  # it serves MODEL's directory

    def device_rules(self, settings: Settings) -> DeviceRules | None:
        return None  # it sizes its own cache

    def memory_failure(self, log_text: str) -> str | None:
        return None  # no planned cache to retry with

    def plan(self, settings: Settings, role: str, install: Install,
             request: PlanRequest | None = None) -> EnginePlan:
        python = install.program if isinstance(install, MlxInstall) else None
        r = request or PlanRequest()
        return server_plan(python or Path("python"), r.model or settings.model,
                           r.port or settings.decode_port,
                           hub_cache=settings.paths().cache / "mlx-hub",
                           host=settings.serve_host, role=role)

    def capacity(self, plan: EnginePlan, log_text: str) -> KvCapacity:
        return KvCapacity()  # its log states no cache size

    def block_size(self, platform: str) -> int:
        return 1  # its prompt cache matches a prefix token by token

    def launch_settings(self, argv: list[str]) -> LaunchSettings:
        return LaunchSettings()

    def effective_args(self, log_text: str | None, argv: list[str] | None) -> EngineArgs | None:
        if not _is_mlx_server(argv):
            return None
        assert argv is not None
        after = argv[argv.index("server") + 1:]
        return EngineArgs(values=argv_args(after), source="command line",
                          detail="`mlx_lm server`'s argv")

    def unread_content(self, root: str) -> dict[tuple[str, str], str]:
        return {}

    def connector_of(self, args: EngineArgs) -> tuple[str, str | None]:
        return "none", None

    async def version(self, client: httpx.AsyncClient, root: str) -> str | None:
        return None  # no /version

    def version_note(self, version: str) -> str | None:
        return None

    async def describe(self, client: httpx.AsyncClient, root: str, facts_out: InstanceFacts,
                       snap: Snapshot | None) -> bool:
        if not _is_mlx_server(local.listening_argv(root, facts_out.notes)):
            return False
        facts_out.engine, facts_out.connector = MLX_LM, "none"
        facts_out.content_digest = local.content_digest(facts_out.root)
        facts_out.notes.append("mlx-lm: recognised by its command line; it states no cache "
                               "size, block size or version")
        return True

    def cache_size(self, snap: Snapshot) -> int | None:
        return None

    async def tokenize(self, client: httpx.AsyncClient, root: str, text: str) -> list[int] | None:
        return None  # no /tokenize

    async def detokenize(self, client: httpx.AsyncClient, root: str, model: str,
                         tokens: list[int]) -> str | None:
        return None

    def resettable(self, plan: EnginePlan) -> bool:
        return False  # no route empties its prompt cache

    def poolable(self, plan: EnginePlan) -> EnginePlan:
        return plan

    async def cached_probe(self, client: httpx.AsyncClient, plan: EnginePlan,
                           prompt: str) -> tuple[int, int]:
        return await openai_cached(client, plan.served_name, prompt)

    async def reset_cache(self, client: httpx.AsyncClient, plan: EnginePlan) -> str:
        raise EngineError("mlx_lm.server has no route that empties its prompt cache: restart it")

    async def tokenize_chat(self, client: httpx.AsyncClient, root: str, model: str,
                            messages: list[dict[str, str]]) -> list[int] | None:
        return None

    async def cache_shape(self, client: httpx.AsyncClient, root: str,
                          snap: Snapshot | None) -> CacheShape | None:
        return None


MLX_ENGINE = MlxEngine()
