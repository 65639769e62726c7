"""Lines that measure nothing: a lab row that cannot be measured on this machine, and why
(`not-run`), and the user's own answer to one of the labs' questions (`note`).

Every figure is another module's; these lines only say something beside the labs' tables.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Record


class NotRunRecord(Record):
    """A lab row that cannot be measured on this machine, and why."""

    kind: ClassVar[str] = "not-run"
    record: Literal["not-run"] = "not-run"
    row: str
    reason: str


NOTE_TOPICS = ("host-tier", "store", "disk", "quantised", "configuration")


class NoteRecord(Record):
    """The user's own answer to one of the labs' questions (`kvlab note`), in their words,
    shown beside the answer kvlab drafted from the rows."""

    kind: ClassVar[str] = "note"
    record: Literal["note"] = "note"
    about: Literal["host-tier", "store", "disk", "quantised", "configuration"]
    text: str = Field(min_length=1, max_length=2000)
