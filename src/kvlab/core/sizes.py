"""Byte counts: how big a directory tree (or a KV store's directory) is, and how a byte count
reads (decimal units)."""

from __future__ import annotations

from pathlib import Path


def human_bytes(n: float) -> str:
    """603979776 -> '603.98 MB' (decimal, as link speeds are quoted)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} B" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (or of `path` itself)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def store_size(path: str) -> int | None:
    """Bytes under a store directory (ExampleConnector writes one file per layer and prompt)."""
    root = Path(path).expanduser() if path else None
    if root is None or not root.is_dir():
        return None
    return tree_bytes(root)
