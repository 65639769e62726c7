"""The orchestrated experiments behind `kvlab run NAME`, and the one contract they share.

Each experiment is a module with a spec (a frozen dataclass owning its defaults and checks)
and `async def run(lab, spec) -> list[Record]`: it starts and always stops its own engines,
writes every notebook line through `lab.record`, and returns them. Modules with plans to show
also have `dry_run(lab, spec) -> list[dict]`, which starts, installs and writes nothing.

The registry names the modules (imported on use, so `kvlab --help` stays instant) and the
labs' report rows each one fills, so a failed experiment can say why those rows are empty.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from kvlab.engines import LLAMA_CPP, MLX_LM, ROUTER_NEEDED, VLLM
from kvlab.records import rows

# `kvlab run disagg --part`: the load comparison (the default) and the lab's procedure steps
DISAGG_PARTS = ("load", "cancel", "boundary")


@dataclass(frozen=True)
class Registered:
    name: str
    module: str
    rows: tuple[rows.Row, ...]
    needs: tuple[str, ...] = (VLLM,)  # only these are installed before it runs

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


EXPERIMENTS: dict[str, Registered] = {e.name: e for e in (
    Registered("disk", "kvlab.experiments.llama_disk", (rows.DISK,), (LLAMA_CPP,)),
    Registered("interference", "kvlab.experiments.llama_interference", (rows.INTERFERENCE,),
               (LLAMA_CPP,)),
    Registered("llama-tiers", "kvlab.experiments.llama_tiers",
               (rows.LLAMA_PROMPT_OFF, rows.LLAMA_PROMPT_ON, rows.LLAMA_RAM_OFF, rows.LLAMA_RAM_ON,
                rows.LLAMA_RAM_SMALL, rows.LLAMA_RAM_CURVE, rows.LLAMA_KV_QUANT),
               (LLAMA_CPP,)),
    Registered("mlx-cache", "kvlab.experiments.mlx_cache", (rows.MLX_CACHE, rows.MLX_TURNS),
               (MLX_LM,)),
    Registered("shared-slots", "kvlab.experiments.llama_slot_share", (rows.SHARED_SLOTS,),
               (LLAMA_CPP,)),
    Registered("offload", "kvlab.experiments.offload",
               (rows.QUIET_OFF, rows.QUIET_ON, rows.PRESSURE_OFF, rows.PRESSURE_ON)),
    # `kvlab run offload --part curve|boundary`: the tier at several sizes or opening lengths
    Registered("offload-sizes", "kvlab.experiments.tier_sizes",
               (rows.OFFLOAD_CURVE, rows.OFFLOAD_BOUNDARY)),
    Registered("shared", "kvlab.experiments.shared", (rows.SHARED_STORE,)),
    Registered("disagg", "kvlab.experiments.disagg",
               (rows.BASELINE, rows.SPLIT_LOOPBACK, rows.CANCEL, rows.BOUNDARY)),
    Registered("replicas", "kvlab.experiments.replicas", (rows.REPLICAS,),
               (VLLM, ROUTER_NEEDED)),
)}
# what `kvlab run all` runs, in order: the llama.cpp tiers (seconds) before the vLLM labs;
# disk and shared-slots side by side, as their llama-server plans are the same (one engine,
# kept and reset between them: `engines/reuse.py`)
RUN_ALL = ("disk", "shared-slots", "mlx-cache", "interference", "llama-tiers", "offload",
           "shared", "disagg", "replicas")


def registered(name: str) -> Registered:
    return EXPERIMENTS[name]


def needs_of(names: tuple[str, ...]) -> tuple[str, ...]:
    """What the experiments `names` need installed, together."""
    return tuple(dict.fromkeys(n for name in names for n in EXPERIMENTS[name].needs))
