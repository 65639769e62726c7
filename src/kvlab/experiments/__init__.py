"""The orchestrated experiments behind `kvlab run NAME`: their one list, and the contract they
share.

Each experiment is a module with a spec (a frozen dataclass owning its defaults and checks),
`async def run(lab, spec) -> list[Record]` (it starts and always stops its own engines, writes
every notebook line through `lab.record`, and returns them), `dry_run(lab, spec)` (its plans,
or why a row would not run: starts, installs and writes nothing) and `all_spec(lab, sizes)`
(its spec at `kvlab run all`'s sizes, where it takes part in run all).

`EXPERIMENTS` is the one place that names them: each entry says which module, which report
rows it fills (from `records/rows.py`, so a failed experiment records them as not run), its
arguments model (the CLI makes `kvlab run NAME`'s options from it), what it needs installed,
whether `kvlab run all` runs it and in which order, and how the CLI shows its lines. Modules
are imported on use, so `kvlab --help` stays instant.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from kvlab.engines import LLAMA_CPP, MLX_LM, VLLM
from kvlab.experiments.args import RunArgs
from kvlab.experiments.llama_args import DiskArgs, InterferenceArgs, LlamaTiersArgs, SharedSlotsArgs
from kvlab.experiments.offload_args import MlxCacheArgs, OffloadArgs, VllmDiskArgs
from kvlab.experiments.pd_args import DisaggArgs, ReplicasArgs, SharedArgs
from kvlab.records import rows

# what other packages read: the list and its entries, and the CLI's modules (the arguments
# models; `execute`, `everything`, `manual`, `demo` and `serve`, imported on use)
__all__ = ["EXPERIMENTS", "RUN_ALL", "Registered", "View", "all_args", "args", "commands",
           "demo", "everything", "execute", "manual", "manual_args", "needs_of", "registered",
           "serve"]

View = Literal["lines", "disk", "interference", "slots", "replicas"]
"""How the CLI shows an experiment's lines (`report/console_run.VIEWS`)."""


@dataclass(frozen=True)
class Registered:
    name: str  # `kvlab run NAME`
    module: str
    rows: tuple[rows.Row, ...]
    args: type[RunArgs] | None  # None: reached through another's command (its --part)
    needs: tuple[str, ...] = (VLLM,)  # the engines it starts, installed before it runs
    in_all: bool = True  # `kvlab run all` runs it, in this list's order
    here: bool = False  # times files on this machine's disk: never placed on a Ray node
    view: View = "lines"
    shows_plans: bool = False  # its module has `dry_run` (its plans ahead of a run)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines it starts (what else it uses, such as replicas' vllm-router, it
        installs itself when it gets there, and says why where it cannot)."""
        return self.needs


# in `kvlab run all`'s order: the llama.cpp tiers (seconds) before the vLLM labs; disk and
# shared-slots side by side, as their llama-server plans are the same (one engine, kept and
# reset between them: `engines/reuse.py`)
EXPERIMENTS: dict[str, Registered] = {e.name: e for e in (
    Registered("disk", "kvlab.experiments.llama_disk", (rows.DISK,), DiskArgs, (LLAMA_CPP,),
               here=True, view="disk"),
    Registered("shared-slots", "kvlab.experiments.llama_slot_share", (rows.SHARED_SLOTS,),
               SharedSlotsArgs, (LLAMA_CPP,), here=True, view="slots"),
    Registered("mlx-cache", "kvlab.experiments.mlx_cache", (rows.MLX_CACHE, rows.MLX_TURNS),
               MlxCacheArgs, (MLX_LM,), here=True, view="disk"),
    Registered("interference", "kvlab.experiments.llama_interference", (rows.INTERFERENCE,),
               InterferenceArgs, (LLAMA_CPP,), view="interference"),
    Registered("llama-tiers", "kvlab.experiments.llama_tiers",
               (rows.LLAMA_PROMPT_OFF, rows.LLAMA_PROMPT_ON, rows.LLAMA_RAM_OFF, rows.LLAMA_RAM_ON,
                rows.LLAMA_RAM_SMALL, rows.LLAMA_RAM_CURVE, rows.LLAMA_KV_QUANT),
               LlamaTiersArgs, (LLAMA_CPP,)),
    Registered("offload", "kvlab.experiments.offload",
               (rows.QUIET_OFF, rows.QUIET_ON, rows.PRESSURE_OFF, rows.PRESSURE_ON), OffloadArgs,
               shows_plans=True),
    # `kvlab run offload --part curve|boundary`: the tier at several sizes or opening lengths
    Registered("offload-sizes", "kvlab.experiments.tier_sizes",
               (rows.OFFLOAD_CURVE, rows.OFFLOAD_BOUNDARY), None, in_all=False, shows_plans=True),
    Registered("vllm-disk", "kvlab.experiments.vllm_disk", (rows.VLLM_DISK,), VllmDiskArgs,
               here=True, view="disk", shows_plans=True),
    Registered("shared", "kvlab.experiments.shared", (rows.SHARED_STORE,), SharedArgs,
               shows_plans=True),
    Registered("disagg", "kvlab.experiments.disagg",
               (rows.BASELINE, rows.SPLIT_LOOPBACK, rows.CANCEL, rows.BOUNDARY), DisaggArgs,
               shows_plans=True),
    Registered("replicas", "kvlab.experiments.replicas", (rows.REPLICAS,), ReplicasArgs,
               view="replicas", shows_plans=True),
)}
RUN_ALL = tuple(e.name for e in EXPERIMENTS.values() if e.in_all)


def registered(name: str) -> Registered:
    return EXPERIMENTS[name]


def commands() -> list[Registered]:
    """The experiments with a `kvlab run NAME` of their own."""
    return [e for e in EXPERIMENTS.values() if e.args is not None]


def needs_of(names: tuple[str, ...]) -> tuple[str, ...]:
    """What the experiments `names` need installed, together."""
    return tuple(dict.fromkeys(n for name in names for n in EXPERIMENTS[name].needs))
