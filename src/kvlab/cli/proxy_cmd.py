"""`kvlab proxy`: kvlab's prefill/decode proxy in the foreground, or `--check` one crossing.

Like the seed's `run-proxy.sh` it first checks that every engine answers (and, unlike it,
that they agree on everything `kvlab check` compares, less `--ignore FIELD`), prints where
everything is (the address as bound: 0.0.0.0 stays 0.0.0.0), then serves with PROXY_WORKERS
processes until Ctrl-C (exit 130) or SIGTERM (exit 0). Listening beyond loopback with no
client key prints one warning line on stderr at every start. `--check` instead sends one
request and shows
the engines' evidence that it crossed both legs; `--check --url URL` does that for a proxy
already running (any proxy), whose legs it reads from the proxy's own /health (kvlab's names
them there), not from the default ports; one engine on both legs is named as the cause.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.cli.reuse_cmd import ignore_option
from kvlab.core.errors import RefusedError
from kvlab.proxy.legs import BALANCES
from kvlab.proxy.pd import CONNECTORS


@click.command("proxy")
@click.option("--prefill", multiple=True, metavar="URL",
              help="A prefill engine, host:port or http://host:port; repeat for several "
                   "(default PREFILL_HOST:PREFILL_PORT).")
@click.option("--decode", multiple=True, metavar="URL",
              help="A decode engine; repeat for several (default DECODE_HOST:DECODE_PORT).")
@click.option("--port", type=click.IntRange(0, 65535), help="Port to listen on (PROXY_PORT).")
@click.option("--host", help="Address to bind (SERVE_HOST, 127.0.0.1 by default).")
@click.option("--connector", type=click.Choice(CONNECTORS), help="Override CONNECTOR.")
@click.option("--balance", type=click.Choice(BALANCES), default="round-robin",
              show_default=True, help="How a repeated leg is chosen per request.")
@click.option("--workers", type=click.IntRange(1, 64),
              help="Processes serving the port (PROXY_WORKERS, 2 by default).")
@ignore_option
@click.option("--check", is_flag=True,
              help="Send one request and show the evidence it crossed both legs, then stop.")
@click.option("--url", help="With --check: a proxy already running there, instead of ours.")
@json_option
@click.pass_context
def proxy_command(ctx: click.Context, prefill: tuple[str, ...], decode: tuple[str, ...],
                  port: int | None, host: str | None, connector: str | None, balance: str,
                  workers: int | None, ignore: tuple[str, ...], check: bool, url: str | None,
                  as_json: bool) -> None:
    """Run kvlab's prefill/decode proxy (OpenAI-compatible) in the foreground."""
    from kvlab.proxy.config import ProxyConfig

    loaded = settings_from(ctx, connector=connector)
    out = Output(as_json)
    config = ProxyConfig.from_settings(loaded.values, prefill, decode, ignore, host=host,
                                       port=port, balance=balance, workers=workers)
    if url and not check:
        raise click.UsageError("--url only goes with --check")
    from kvlab.proxy.app import loop_runner

    runner = loop_runner()
    if check:
        result = runner.run(_check(config, loaded.values.served_name, url))
        out.result(result, lambda console: _render_check(console, result))
        if not result["crossed"]:
            raise RefusedError("the request did not cross both legs: "
                               + "; ".join(result["reasons"]))
        return
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    console = out.err if out.as_json else out.console
    console.print("==> Checking the engines")
    on_ready = _on_ready(config, out, console)
    if config.workers > 1:
        from kvlab.proxy.workers import serve_workers

        serve_workers(config, on_ready)
    else:
        runner.run(_serve(config, on_ready))
    console.print("==> stopped")


def _on_ready(config: Any, out: Output, console: Console) -> Callable[[str, object], None]:
    def ready(url: str, agreement: object) -> None:
        from dataclasses import replace
        from urllib.parse import urlsplit

        # whatever the start-up check returned: LegFacts, or another check's facts
        for fact in agreement if isinstance(agreement, list) else []:
            role = getattr(fact, "role", "engine")
            console.print(f"    OK: the {role} instance answers on {getattr(fact, 'url', '?')} "
                          f"(model {getattr(fact, 'model_id', '?')}, max_model_len "
                          f"{getattr(fact, 'max_model_len', '?')})")
        bound = replace(config, port=urlsplit(url).port)
        summary = {**bound.summary(), "local_url": url}
        _render_summary(console, summary)
        warning = config.exposure_warning()
        if warning:
            out.err.print(f"kvlab: warning: {warning}")
        if out.as_json:
            out.result({"proxy": summary, "ready": True}, lambda c: None)
            sys.stdout.flush()
    return ready


async def _serve(config: Any, on_ready: Callable[[str, object], None]) -> None:
    from kvlab.proxy import serve

    # SIGTERM (a service manager's stop) ends serving as cleanly as Ctrl-C does; kvlab runs on
    # POSIX systems only (the notebook's lock is fcntl), where loops take signal handlers
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await serve(config, lambda app: on_ready(app.url, app.agreement), stop)


def _render_summary(console: Console, summary: dict[str, Any]) -> None:
    console.print("\n==> Proxy")
    console.print(f"    connector  {summary['connector']} ({summary['balance']})")
    console.print(f"    prefill    {', '.join(summary['prefill'])}")
    console.print(f"    decode     {', '.join(summary['decode'])}")
    console.print(f"    client key {summary['client_key']}")
    console.print(f"    workers    {summary['workers']}")
    local = summary["local_url"]
    also = "" if local == summary["listen"] else f" (from this machine: {local})"
    console.print(f"    listening  {summary['listen']}{also}\n")
    console.print("    Send every measured request to the proxy and nothing to the engines "
                  "directly.\n    `kvlab proxy --check` proves a request crosses both legs. "
                  "Ctrl-C stops the proxy.")
    console.print(f"==> ready: {summary['listen']}")


async def _check(config: Any, model: str, url: str | None) -> dict[str, Any]:
    from dataclasses import replace

    from kvlab.proxy import running
    from kvlab.proxy.check import crossing_check

    urls = config.urls
    if url:
        proxy = url.rstrip("/")
        legs = await running_legs(proxy, config.api_key)
        found = legs is not None
        urls = legs or urls
        crossing = await crossing_check(proxy, urls["prefill"], urls["decode"], model,
                                        api_key=config.api_key)
        result = crossing.as_dict()
        result["legs_from"] = (f"{proxy}/health" if found else "the settings (the proxy's "
                               "/health did not name its legs: send its key)")
        same = sorted(set(urls["prefill"]) & set(urls["decode"]))
        if same:  # the cause, before any symptom crossing_check read from the counters
            result["reasons"] = [f"{same[0]} is both the prefill and the decode leg: decode "
                                 "served the prompt from its own prefix cache, so nothing "
                                 "crossed", *crossing.reasons]
            result["crossed"] = False
        return result
    async with running(replace(config, host="127.0.0.1", port=0)) as app:
        crossing = await crossing_check(app.url, urls["prefill"], urls["decode"], model,
                                        api_key=config.api_key)
    return {**crossing.as_dict(), "legs_from": "this proxy's settings"}


async def running_legs(proxy: str, api_key: str) -> dict[str, list[str]] | None:
    """The legs a running proxy names on /health ("prefill URL": state), by role; None when
    it names none by URL (a keyed proxy asked without its key, or another kind of proxy)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
            doc = (await client.get(f"{proxy}/health", headers=headers)).json()
    except (httpx.HTTPError, ValueError):
        return None
    names = (doc.get("legs") or {}) if isinstance(doc, dict) else {}
    legs: dict[str, list[str]] = {"prefill": [], "decode": []}
    for name in names:
        role, _, where = str(name).partition(" ")
        if role in legs and "://" in where:
            legs[role].append(where)
    return legs if legs["prefill"] and legs["decode"] else None


def _render_check(console: Console, result: dict[str, Any]) -> None:
    console.print(f"==> One request through {result['proxy']}: HTTP {result['status']}, "
                  f"{result['seconds']:.3f} s, request id {result['request_id']}")
    console.print(f"    legs from {result['legs_from']}")
    console.print(f"    prompt tokens {result['prompt_tokens']}, block size "
                  f"{result['block_size']}, expected external hits on decode about "
                  f"{result['expected_external_hits']}")
    for role in ("prefill", "decode"):
        for leg, deltas in result[role].items():
            shown = ", ".join(f"{k} +{v:g}" for k, v in deltas.items()
                              if k in ("requests_succeeded", "external_prefix_cache_hits",
                                       "prompt_tokens", "prompt_tokens_external_kv_transfer"))
            console.print(f"    {role:<8} {leg}: {shown or 'no counters moved'}")
    if result["kv_transfer_header"]:
        console.print(f"    the proxy marked the response: x-kvlab-kv-transfer: "
                      f"{result['kv_transfer_header']}")
    console.print("    verdict: " + ("crossed both legs" if result["crossed"]
                                      else "NOT proven: " + "; ".join(result["reasons"])))


COMMANDS = (proxy_command,)
