"""The envelope every notebook line carries, and the strict base every record part builds on.

Every field kvlab writes is declared: `Strict` forbids keys a model does not name and
validates each assignment, so a misspelt field is an error where it is made (at write time)
and `mypy --strict` points at every reader of a field that does not exist. The seed scripts'
own lines are read through the separate, lenient `SeedLoadRow` of `upgrade.py`, which also
brings older kvlab lines up to this schema before they are validated here.
"""

from __future__ import annotations

import time
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

from kvlab.core import SCHEMA, VERSION, JsonObject

LAB_OFFLOAD = "part-22/lab-kv-cache-offload-and-sharing"
LAB_PD = "part-22/lab-two-machine-prefill-decode"
LAB_NONE = "none"  # a row no lab's table reads (a replayed trace)


Number = int | float
Deltas = dict[str, Number | None]
"""Evidence counter deltas over a run, by the names the engine adapters give them."""


def now_stamp() -> str:
    """Local time with offset, the seed scripts' `%Y-%m-%dT%H:%M:%S%z` format."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Strict(BaseModel):
    """A record part: no undeclared key, every assignment validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True,
                              populate_by_name=True)

    def overlay(self, part: Strict) -> Self:
        """Take every field `part` was given (a part of this model: one of its bases), each
        validated again; returns self."""
        if not isinstance(self, type(part)):
            raise TypeError(f"{type(part).__name__} is not a part of {type(self).__name__}")
        for name in part.model_fields_set:
            setattr(self, name, getattr(part, name))
        return self

    @classmethod
    def part_of(cls, whole: Strict) -> Self:
        """This part of `whole` (a model built on it): the fields `whole` was given."""
        if not isinstance(whole, cls):
            raise TypeError(f"{cls.__name__} is not a part of {type(whole).__name__}")
        return cls.model_validate({n: getattr(whole, n) for n in whole.model_fields_set
                                   if n in cls.model_fields})


class Record(Strict):
    """The envelope every notebook line carries."""

    kind: ClassVar[str] = ""

    lab: str = Field(description="Which lab the line belongs to.")
    record: str = Field(description="The record kind.")
    label: str = Field(description="The run's label, as the seed scripts use it.")
    recorded_at: str = Field(default_factory=now_stamp)
    kvlab_version: str = VERSION
    schema_version: int = Field(SCHEMA, alias="schema")
    run_id: str | None = Field(None, description="The `kvlab run` that wrote it, if any.")

    def failing(self) -> bool:
        """Whether the line records a check that failed (the command that wrote it exits 1)."""
        return False

    def line(self) -> JsonObject:
        """The JSON object written to the notebook: seed field names, `schema` by its alias,
        and no field that holds nothing (the seed's compare-disagg.py skips a load row without
        `ttft_s`, where a null would stop it)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)
