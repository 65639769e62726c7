"""The replica profile a plan simulates, read from a JSON file.

The file holds the profile's fields as one object (`records.ReplicaProfile`), a
`replica_profile` notebook line (`kvlab plan --measure` writes one), or a notebook of lines, of
which the last `replica_profile` line is taken. A figure the file gives without a source is
labelled "given".

Not here: measuring a profile on an engine (`measure.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from kvlab.core import InputError
from kvlab.records import ProfileRecord, ReplicaProfile


def _profile(obj: object, where: str) -> ReplicaProfile:
    try:
        if isinstance(obj, dict) and obj.get("record") == ProfileRecord.kind:
            return ProfileRecord.model_validate(obj).profile
        return ReplicaProfile.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"]) or "profile"
        raise InputError(f"--profile {where}: {at}: {first['msg']} (a profile names "
                         f"{', '.join(ReplicaProfile.model_fields)})") from None


def with_sources(profile: ReplicaProfile) -> ReplicaProfile:
    """Every figure labelled: those the file gave no source for, "given"."""
    named = {f: "given" for f in ReplicaProfile.model_fields if f != "sources"}
    return profile.model_copy(update={"sources": named | profile.sources})


def read_profile(path: str) -> ReplicaProfile:
    """The profile in `path` (see the module's docstring)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--profile {path}: cannot read it ({exc.strerror})") from None
    try:
        return with_sources(_profile(json.loads(text), path))
    except ValueError:
        pass  # not one JSON document: a notebook of lines
    found = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise InputError(f"--profile {path}:{number}: not a JSON line") from None
        if isinstance(obj, dict) and obj.get("record") == ProfileRecord.kind:
            found = _profile(obj, f"{path}:{number}")
    if found is None:
        raise InputError(f"--profile {path}: no replica_profile line (write one with "
                         "`kvlab plan --measure`, or give the profile's fields as one object)")
    return with_sources(found)
