"""The base of every command's arguments model: strict (no unknown option), frozen once
parsed. `cli/options.py` makes a command's options from a model's fields; the packages that
own a command's arguments (`loadgen/args.py`, `proxy/args.py`, `experiments/*_args.py`)
declare them on this base.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Args(BaseModel):
    """A command's arguments: no unknown option, nothing changed after parsing."""

    model_config = ConfigDict(extra="forbid", frozen=True)
