"""Which model name a load sends, from what the server lists (`/v1/models`).

A stock `vllm serve` answers only the name it serves, and the seed's default SERVED_NAME
(`local-chat`) is kvlab's own: a load against someone else's server used to send every
request to a name it 404s. When no one named the model, the one model the server lists is
taken, and said; a name the user gave that the server does not list is refused before any
request. A server that lists nothing (or does not answer the list) gets the name as given.
"""

from __future__ import annotations

from dataclasses import replace

import httpx

from kvlab.loadgen.spec import LoadSpec
from kvlab.measure import listed_models, pick_model


async def resolve(spec: LoadSpec, api_key: str = "") -> tuple[LoadSpec, str]:
    """`spec` with the model it will send (settled: resolving it again changes nothing), and
    the words that say why ("" when unchanged)."""
    if not spec.model_source:
        return spec, ""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=10.0, trust_env=False, headers=headers) as client:
        listed = await listed_models(client, spec.base_url)
    model, why = pick_model(spec.model, listed, spec.base_url,
                            named=spec.model_source == "named")
    return replace(spec, model=model, model_source=""), why
