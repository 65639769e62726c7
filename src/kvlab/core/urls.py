"""An OpenAI-compatible server's two URLs: its root (`/health`, `/metrics`, `/tokenize`) and
its API base (`/v1`), from either one as a user gives it."""

from __future__ import annotations


def api_base(url: str) -> str:
    """The OpenAI base URL (ending in /v1) for a server root or a /v1 URL."""
    root = url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


def server_root(url: str) -> str:
    """The server's root for a server root or a /v1 URL."""
    return api_base(url).removesuffix("/v1")
