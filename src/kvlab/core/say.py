"""How library code reports progress: through a `Say` callback its caller supplies.

The CLI passes a printer to stderr; tests and other library callers pass nothing and get
`quiet`.
"""

from __future__ import annotations

from collections.abc import Callable

Say = Callable[[str], None]


def quiet(_: str) -> None:
    return None
