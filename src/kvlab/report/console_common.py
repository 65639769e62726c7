"""What more than one of the CLI's renderers (`console_*.py`) says the same way: a time in
milliseconds, and the empty percentiles a row without figures reads as.

It holds no renderer of its own and imports nothing but the records' `Percentiles`, so every
`console_*` module can use it without taking on another's imports. A figure that was not
recorded reads "n/a", never "None".
"""

from __future__ import annotations

from kvlab.records import Percentiles

NONE = Percentiles()


def ms(seconds: float | None) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds is not None else "n/a"
