"""The seed labs' scripts, extracted from the lab documents when they are at hand.

The documents live in the steering checkout's `shared/seeds/` (beside this repository); a
user's machine has none, so tests that need a seed script skip when it is absent.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"


def seed_text() -> str:
    docs = sorted(SEEDS.glob("*.txt")) if SEEDS.is_dir() else []
    return "\n".join(p.read_text(encoding="utf-8") for p in docs)


def extract(name: str, dest: Path) -> Path:
    """Write the seed script `name` to `dest/name` (skip the test if the seeds are absent)."""
    text = seed_text()
    marker = re.search(rf"^Download {re.escape(name)}\d+ lines$", text, re.M)
    if marker is None:
        pytest.skip(f"seed documents with {name} are not at {SEEDS}")
    head = text[: marker.start()]
    if name.endswith(".txt"):
        start = head.rfind(f"\n{name}\n") + len(name) + 2
        body = head[start:].strip("\n") + "\n"
    else:
        start = head.rfind("#!")
        body = head[start:].rstrip("\n") + "\n"
    path = dest / name
    path.write_text(body, encoding="utf-8")
    path.chmod(0o755)
    return path
