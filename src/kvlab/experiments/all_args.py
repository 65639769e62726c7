"""`kvlab run all`'s arguments: which experiments, at which sizes, where the report goes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from kvlab.core import LoadedSettings
from kvlab.experiments import RUN_ALL
from kvlab.experiments.args import PlannedArgs

if TYPE_CHECKING:
    from kvlab.experiments.sizes import AllSpec


class AllArgs(PlannedArgs):
    """Every experiment this machine can run, then `kvlab report` (the README's main command)."""

    quick: bool = Field(False, description="Small sizes: a first look, and CI.")
    only: tuple[str, ...] = Field((), description="Run just these experiments (repeatable).",
                                  json_schema_extra={"choices": list(RUN_ALL)})
    report_dir: str = Field("kvlab-report", description="Where the report and its plots go.")

    def spec(self, loaded: LoadedSettings) -> AllSpec:
        from kvlab.core import GPU_PROFILES
        from kvlab.experiments.sizes import AllSpec

        s, gpu = loaded.values, loaded.profile in GPU_PROFILES
        only = tuple(self.only)
        return (AllSpec.quick(s.prompt_set, only, gpu) if self.quick else AllSpec.lab(
            s.concurrency, s.requests, s.max_tokens, s.preamble_tokens, s.preamble_words,
            s.prompt_set, only, gpu))

    @field_validator("only")
    @classmethod
    def _known(cls, only: tuple[str, ...]) -> tuple[str, ...]:
        if unknown := [name for name in only if name not in RUN_ALL]:
            raise ValueError(f"{unknown[0]} is no experiment of `kvlab run all`; choose "
                             f"from {', '.join(RUN_ALL)}")
        return only
