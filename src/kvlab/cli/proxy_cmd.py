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
import logging
import signal
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import click
from rich.console import Console

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.cli.options import arguments
from kvlab.core import RefusedError
from kvlab.proxy import LegFacts, ProxyArgs, ProxyConfig


@click.command("proxy")
@arguments(ProxyArgs)
@json_option
@click.pass_context
def proxy_command(ctx: click.Context, args: ProxyArgs, as_json: bool) -> None:
    """Run kvlab's prefill/decode proxy (OpenAI-compatible) in the foreground."""
    from kvlab.proxy import loop_runner
    from kvlab.report import console_proxy

    loaded = settings_from(ctx, **args.overrides())
    out = Output(as_json)
    config = args.config(loaded.values)
    url = args.checked_url()
    runner = loop_runner()
    if args.check:
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

        # what the start-up check returned: each leg's facts (another check's: not shown)
        for fact in agreement if isinstance(agreement, list) else []:
            if isinstance(fact, LegFacts):
                shown.print(f"    OK: the {fact.role} instance answers on {fact.url} (model "
                            f"{fact.model_id}, max_model_len {fact.max_model_len})")
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
