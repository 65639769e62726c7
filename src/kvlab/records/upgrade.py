"""Bringing a notebook line up to the schema kvlab writes, before it is validated strictly.

Two kinds of line arrive that are not this schema's:
- the seed scripts' own (measure-reuse.py, run-load.sh, compare-disagg.py and Part 9's
  load-test.py): no `schema` field. Their fields are a subset of kvlab's kinds under the same
  names, except a load-test.py row, which has no `record` field and may carry keys of its own:
  it is read through `SeedLoadRow` (lenient by design: the seed is not kvlab's to change),
  which keeps the fields kvlab declares and says which it left out;
- kvlab's own lines of an older schema: each step below renames what a later kvlab renamed,
  and drops nothing.
A line that still does not validate is reported with its first error, never half-read.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kvlab.core import SCHEMA, JsonObject, integer

SEED_SCHEMA = 0  # a seed script's line: no envelope beyond lab, record, label, recorded_at
SEED_VERSION = "none (a seed script's line)"


class SeedLoadRow(BaseModel):
    """Part 9's load-test.py row, as compare-disagg.py reads it: the keys kvlab declares on a
    load row are kept, any other is left out (`upgraded` names them)."""

    model_config = ConfigDict(extra="ignore")  # the seed's own keys: not kvlab's to declare

    label: str = ""
    concurrency: int


def _from_schema_1(obj: JsonObject) -> JsonObject:
    """Schema 1 wrote a load row's memory fraction as `mem_fraction` in its first sessions."""
    if obj.get("record") == "load" and "mem_fraction" in obj:
        fraction = obj.pop("mem_fraction")
        obj.setdefault("memory_fraction", fraction)
    return obj


def _from_schema_2(obj: JsonObject) -> JsonObject:
    """Schema 2 timed a reuse row's TTFT to its first answer token (`delta.content`) and
    ignored reasoning; schema 3 times TTFT to the first token of either kind and the first
    answer token apart (`observe/sse.py`). So an old row's TTFT is its `ttft_answer_s`;
    its `ttft_s` stays as written (the same figure unless the model reasoned, which schema 2
    did not record). Load rows always counted reasoning: they need nothing."""
    rows = obj.get("rows") if obj.get("record") == "reuse" else None
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("ttft_from") is None and "ttft_answer_s" not in row:
            row["ttft_answer_s"] = row.get("ttft_s")
    return obj


STEPS = {1: _from_schema_1, 2: _from_schema_2}


def upgraded(obj: JsonObject, declared: frozenset[str]) -> tuple[JsonObject, list[str]]:
    """`obj` in this schema's shape, and the keys of a seed line left out because kvlab does
    not declare them (`declared`: a load row's fields)."""
    out: JsonObject = dict(obj)
    left_out: list[str] = []
    if "record" not in out:  # a load-test.py row
        SeedLoadRow.model_validate(out)
        left_out = sorted(k for k in out if k not in declared)
        out = {k: v for k, v in out.items() if k in declared}
        out["record"] = "load"
    version = out.get("schema")
    if version is None:
        out |= {"schema": SEED_SCHEMA, "kvlab_version": SEED_VERSION}
        out.setdefault("lab", "")
        out.setdefault("label", "")
        out.setdefault("recorded_at", "")
        return out, left_out
    for step in range(found if (found := integer(version)) is not None else SCHEMA, SCHEMA):
        out = STEPS[step](out) if step in STEPS else out
    return out, left_out

