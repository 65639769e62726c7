"""One pydantic model per notebook record kind: what writers build and readers parse.

Every line kvlab writes is one of these, serialised by `notebook.append`. The envelope (`lab`,
`record`, `label`, `recorded_at`, `kvlab_version`, `schema`, `run_id`) is common; each kind
names the fields the seed scripts write or read (their names are kept, so `compare-disagg.py`
and `measure-reuse.py` read kvlab's lines) and the evidence kvlab adds, every part declared
(`base.py` and `evidence.py` for the parts many kinds share, `workload.py` and `pressure.py` for
a load run's; each kind in the module that owns it: `startup.py`, `reuse.py`, `load.py`,
`link.py`, `capacity.py`, `comparison.py`, `pd.py`, `disk.py`, `notes.py`, `replicas.py`,
`floor.py`, `plan.py`).

Readers go through `parse`: the line is brought up to this schema (`upgrade.py`: a seed
script's line, an older kvlab's), then validated by its kind's model with no undeclared key.
A line that does not validate is an `Unreadable` with its first error, never a half-read record.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from kvlab.core import JsonObject
from kvlab.records.base import LAB_OFFLOAD, LAB_PD, Record, now_stamp
from kvlab.records.capacity import CapacityRecord
from kvlab.records.comparison import ComparisonRecord, KvQuantRecord
from kvlab.records.disk import DiskRecord
from kvlab.records.evidence import Percentiles
from kvlab.records.floor import CopyRateRecord
from kvlab.records.link import LinkRecord
from kvlab.records.load import LoadRecord
from kvlab.records.notes import NoteRecord, NotRunRecord
from kvlab.records.pd import (
    BoundaryPointRecord,
    BoundaryRecord,
    CrossingRecord,
    PredictionRecord,
    ProcedureRecord,
)
from kvlab.records.plan import PlanRecord, ProfileRecord
from kvlab.records.replicas import ReplicasRecord
from kvlab.records.reuse import ProofRecord, ReuseRecord, ReuseRow
from kvlab.records.startup import StartupRecord
from kvlab.records.upgrade import upgraded

__all__ = [
    "BY_KIND",
    "KINDS",
    "LAB_OFFLOAD",
    "LAB_PD",
    "BoundaryPointRecord",
    "BoundaryRecord",
    "CapacityRecord",
    "ComparisonRecord",
    "CopyRateRecord",
    "CrossingRecord",
    "DiskRecord",
    "KvQuantRecord",
    "LinkRecord",
    "LoadRecord",
    "NotRunRecord",
    "NoteRecord",
    "Percentiles",
    "PlanRecord",
    "PredictionRecord",
    "ProcedureRecord",
    "ProfileRecord",
    "ProofRecord",
    "Record",
    "ReplicasRecord",
    "ReuseRecord",
    "ReuseRow",
    "StartupRecord",
    "Unreadable",
    "json_schemas",
    "now_stamp",
    "parse",
]

KINDS: tuple[type[Record], ...] = (
    StartupRecord, ReuseRecord, ProofRecord, LoadRecord, LinkRecord, ComparisonRecord,
    PredictionRecord, CrossingRecord, NotRunRecord, DiskRecord, ProcedureRecord,
    BoundaryPointRecord, BoundaryRecord, CapacityRecord, KvQuantRecord, NoteRecord,
    ReplicasRecord, CopyRateRecord, ProfileRecord, PlanRecord,
)
BY_KIND: dict[str, type[Record]] = {cls.kind: cls for cls in KINDS}
_LOAD_FIELDS = frozenset(f.alias or name for name, f in LoadRecord.model_fields.items())


@dataclass(frozen=True)
class Unreadable:
    """A notebook object that is no record kvlab reads, and why."""

    why: str
    foreign: bool  # no kind kvlab or the seeds write (another tool's line, a newer kvlab's)


def is_record(obj: JsonObject) -> bool:
    """Whether a JSON object is shaped like a notebook record at all (a seed load row has no
    `record`: it is recognised by its concurrency and TTFT percentiles)."""
    return isinstance(obj.get("record"), str) or (
        "concurrency" in obj and isinstance(obj.get("ttft_s"), dict))


def parse(obj: JsonObject) -> Record | Unreadable:
    """A notebook object as its typed record, or why it cannot be one."""
    if not is_record(obj):
        return Unreadable("not a notebook record: no `record` field", foreign=True)
    kind = obj.get("record", "load")
    cls = BY_KIND.get(str(kind))
    if cls is None:
        return Unreadable(f"record {kind!r}: a kind this kvlab does not know", foreign=True)
    try:
        data, _ = upgraded(obj, _LOAD_FIELDS)
        return cls.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "line"
        return Unreadable(f"{kind} line, label {obj.get('label')!r}: {where}: {first['msg']}",
                          foreign=False)


def json_schemas() -> dict[str, JsonObject]:
    """Each record kind's JSON Schema, by kind (`kvlab schema` prints them)."""
    return {cls.kind: cls.model_json_schema(by_alias=True) for cls in KINDS}
