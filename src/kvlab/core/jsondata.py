"""Reading JSON that another program wrote (an engine's reply, a config file, Ray's node list)
without trusting its shape: each accessor returns the value only when it has the type asked
for, else a default, so a missing or odd field is a `None` the caller handles, never a
KeyError or a TypeError three calls later.
"""

from __future__ import annotations

# a JSON object as it came off the wire or goes onto it: readers narrow each value they use
JsonObject = dict[str, object]


def dig(value: object, *path: str | int) -> object:
    """`value[path[0]][path[1]]...`, through objects and arrays; None where a step is missing."""
    for step in path:
        if isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        elif isinstance(step, int) and isinstance(value, list) and -len(value) <= step < len(value):
            value = value[step]
        else:
            return None
    return value


def obj(value: object) -> JsonObject:
    """`value` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def items(value: object) -> list[object]:
    """`value` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def integer(value: object) -> int | None:
    """`value` as an int when it is a whole number (not a bool), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def number(value: object) -> float | None:
    """`value` as a float when it is a number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def text(value: object) -> str | None:
    """`value` when it is a string, else None."""
    return value if isinstance(value, str) else None


def integers(value: object) -> list[int] | None:
    """`value` as a list of ints when it is an array of whole numbers, else None."""
    if not isinstance(value, list):
        return None
    found = [integer(v) for v in value]
    return None if any(v is None for v in found) else [v for v in found if v is not None]
