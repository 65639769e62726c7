"""What `kvlab proxy` prints, for a person at a terminal: where the proxy listens with its legs
and key once it serves, and what one request through it (`--check`) moved on each leg.

It renders the proxy's own results only; the load sent through a proxy is `console_load.py`'s.
Nothing here measures or decides.
"""

from __future__ import annotations

from rich.console import Console

from kvlab.proxy import Crossing, ProxyConfig, listen_url


def proxy_ready(console: Console, config: ProxyConfig, local_url: str) -> None:
    """Where the proxy listens, its legs and its key, once it serves."""
    console.print("\n==> Proxy")
    console.print(f"    connector  {config.connector} ({config.balance})")
    console.print(f"    prefill    {', '.join(config.urls['prefill'])}")
    console.print(f"    decode     {', '.join(config.urls['decode'])}")
    console.print(f"    client key {'required' if config.api_key else 'none'}")
    console.print(f"    workers    {config.workers}")
    listen = listen_url(config.host, config.port)
    also = "" if local_url == listen else f" (from this machine: {local_url})"
    console.print(f"    listening  {listen}{also}\n")
    console.print("    Send every measured request to the proxy and nothing to the engines "
                  "directly.\n    `kvlab proxy --check` proves a request crosses both legs. "
                  "Ctrl-C stops the proxy.")
    console.print(f"==> ready: {listen}")


def crossing(console: Console, result: Crossing) -> None:
    """One request through a proxy: what each leg's counters say, and the verdict."""
    console.print(f"==> One request through {result.proxy}: HTTP {result.status}, "
                  f"{result.seconds:.3f} s, request id {result.request_id}")
    console.print(f"    legs from {result.legs_from}")
    console.print(f"    prompt tokens {result.prompt_tokens}, block size {result.block_size}, "
                  f"expected external hits on decode about {result.expected_external_hits}")
    for role, legs in (("prefill", result.prefill), ("decode", result.decode)):
        for leg, deltas in legs.items():
            shown = ", ".join(f"{k} +{v:g}" for k, v in deltas.items() if v is not None
                              and k in ("requests_succeeded", "external_prefix_cache_hits",
                                        "prompt_tokens", "prompt_tokens_external_kv_transfer"))
            console.print(f"    {role:<8} {leg}: {shown or 'no counters moved'}")
    if result.kv_transfer_header:
        console.print(f"    the proxy marked the response: x-kvlab-kv-transfer: "
                      f"{result.kv_transfer_header}")
    console.print("    verdict: " + ("crossed both legs" if result.crossed
                                      else "NOT proven: " + "; ".join(result.reasons)))
