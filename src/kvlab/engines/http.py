"""Two tolerant JSON calls the engine adapters probe servers with: None instead of an error."""

from __future__ import annotations

import httpx


async def get_json(client: httpx.AsyncClient, url: str) -> dict[str, object] | None:
    """The JSON object at `url`, or None (no answer, not 200, not an object)."""
    try:
        response = await client.get(url)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


async def post_json(client: httpx.AsyncClient, url: str,
                    payload: dict[str, object]) -> dict[str, object] | None:
    """The JSON object answered to a POST of `payload`, or None."""
    try:
        response = await client.post(url, json=payload)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None
