"""The arguments of the llama.cpp experiments (`kvlab run disk`, `shared-slots`,
`interference`, `llama-tiers`) and the specs they make with the settings.

Each field is one command-line option (`cli/options.py`); `spec(loaded)` imports the
experiment's module only then, so `kvlab --help` stays instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from kvlab.core import LoadedSettings, SettingError
from kvlab.experiments.args import REPEAT_HELP, LocalArgs, PlacementArgs

if TYPE_CHECKING:
    from kvlab.experiments.llama_disk import DiskSpec
    from kvlab.experiments.llama_interference import InterferenceSpec
    from kvlab.experiments.llama_slot_share import SharedSlotsSpec
    from kvlab.experiments.llama_tiers import LlamaTiersSpec


class DiskArgs(LocalArgs):
    """Time the disk tier: cold prefill, save, erase, control, restore, the prompt again."""

    prompt_tokens: int = Field(3500, ge=16, description="Length of the long prompt, in the "
                               "model's tokens.")
    ctx: int = Field(8192, ge=256, description="The experiment server's --ctx-size (a slot "
                     "holds ctx/parallel).")
    parallel: int = Field(2, ge=1, le=64, description="The experiment server's --parallel.")
    cache_ram: int = Field(0, ge=-1, description="--cache-ram MiB; 0 keeps the RAM prompt "
                           "cache from faking a restore.")
    cache_type: str | None = Field(None, description="KV type for -ctk/-ctv (default: "
                                   "LLAMA_CACHE_TYPE).")
    label: str = Field("disk", description="Notebook label.")
    keep_file: bool = Field(False, description="Keep the slot file and manifest in the store.")

    def overrides(self) -> dict[str, object]:
        return {"llama_cache_type": self.cache_type}

    def spec(self, loaded: LoadedSettings) -> DiskSpec:
        from kvlab.experiments.llama_disk import DiskSpec

        return DiskSpec(prompt_tokens=self.prompt_tokens, ctx=self.ctx, parallel=self.parallel,
                        cache_ram_mib=self.cache_ram, label=self.label,
                        keep_file=self.keep_file)


class SharedSlotsArgs(LocalArgs):
    """Two llama-servers share one slot store: save on A, restore on B, prove reuse on B."""

    prompt_tokens: int = Field(2000, ge=16, description="Length of the prompt, in the model's "
                               "tokens.")
    ctx: int = Field(8192, ge=256, description="Both servers' --ctx-size.")
    parallel: int = Field(2, ge=2, le=64, description="Both servers' --parallel.")
    cache_type: str | None = Field(None, description="KV type for -ctk/-ctv (default: "
                                   "LLAMA_CACHE_TYPE).")
    label: str = Field("shared-slots", description="Notebook label.")
    keep_file: bool = Field(False, description="Keep the slot file and manifest in the store.")

    def overrides(self) -> dict[str, object]:
        return {"llama_cache_type": self.cache_type}

    def spec(self, loaded: LoadedSettings) -> SharedSlotsSpec:
        from kvlab.experiments.llama_slot_share import SharedSlotsSpec

        return SharedSlotsSpec(prompt_tokens=self.prompt_tokens, ctx=self.ctx,
                               parallel=self.parallel, label=self.label,
                               keep_file=self.keep_file)


class InterferenceArgs(PlacementArgs):
    """Prefill interference: the same load with --parallel 4, then 1 (one variable)."""

    concurrency: int = Field(4, ge=1, description="Concurrent conversations (the lab uses 4).")
    parallel: str = Field("4,1", description="The --parallel values to compare, the first as "
                          "baseline.")
    requests: int | None = Field(None, ge=1, description="Requests per run (default: "
                                 "REQUESTS).")
    ctx: int | None = Field(None, ge=256, description="--ctx-size for both runs (default: "
                            "CTX).")
    prompt_set: str | None = Field(None, description="Prompt set (default: PROMPT_SET).")
    label: str = Field("interference", description="Label prefix: rows are "
                       "LABEL-parallel-N.")
    repeat: int = Field(1, ge=1, description=REPEAT_HELP)

    def overrides(self) -> dict[str, object]:
        return {"requests": self.requests, "prompt_set": self.prompt_set, "ctx": self.ctx}

    def parallels(self) -> tuple[int, ...]:
        try:
            values = tuple(int(p) for p in self.parallel.split(","))
        except ValueError:
            values = ()
        if len(values) < 2 or min(values) < 1 or len(set(values)) < len(values):
            raise SettingError(f"--parallel {self.parallel!r}: give two or more different slot "
                               "counts, e.g. 4,1")
        return values

    def spec(self, loaded: LoadedSettings) -> InterferenceSpec:
        from kvlab.experiments.llama_interference import InterferenceSpec

        s = loaded.values
        # a shared preamble lets one slot reuse it and hides the interference being measured
        prompt_set = "mixed" if loaded.sources["prompt_set"] == "default" else s.prompt_set
        return InterferenceSpec(concurrency=self.concurrency, parallels=self.parallels(),
                                requests=loaded.values.requests, max_tokens=s.max_tokens,
                                prompt_set=prompt_set, ctx=s.ctx, label=self.label,
                                repeat=self.repeat)


class LlamaTiersArgs(PlacementArgs):
    """llama.cpp's tasks 2 and 3: prompt caching off/on, the RAM cache under pressure and its
    size curve, q8_0 against f16 KV in the same memory."""

    part: tuple[Literal["turns", "pressure", "curve", "quant", "all"], ...] = Field(
        ("all",), description="Which part to run (repeatable; default all).")
    turns: int = Field(6, ge=2, description="--part turns: turns of the conversation.")
    slots: int = Field(2, ge=1, le=16, description="--part pressure: llama-server's "
                       "--parallel.")
    users: int = Field(0, ge=0, description="--part pressure: users, one conversation each "
                       "(default: three per slot).")
    slot_ctx: int = Field(4096, ge=512, description="--part pressure: tokens per slot.")
    think_time: str = Field("", description="--part pressure: think time between a reply and "
                            "the next turn (default: paced to one user per slot).")
    quant_ctx: int = Field(4096, ge=512, description="--part quant: the f16 server's "
                           "--ctx-size; its KV cache is the memory both KV types get.")
    repeat: int = Field(1, ge=1, description=REPEAT_HELP + " (--part curve runs each size "
                        "once: its intervals are over requests)")

    def spec(self, loaded: LoadedSettings) -> LlamaTiersSpec:
        from kvlab.experiments.llama_tiers import PARTS, LlamaTiersSpec

        parts = PARTS if "all" in self.part else tuple(p for p in PARTS if p in self.part)
        spec = LlamaTiersSpec(parts=parts, turns=self.turns, slots=self.slots,
                              users=self.users, slot_ctx=self.slot_ctx,
                              think_time=self.think_time, quant_ctx=self.quant_ctx,
                              repeat=self.repeat)
        spec.check()
        return spec
