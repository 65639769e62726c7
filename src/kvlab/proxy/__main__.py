"""`python -m kvlab.proxy ARGS_JSON --host HOST --port PORT`: kvlab's proxy as a process of
its own, given its `ProxyArgs` as JSON and where it listens as flags (`args.process_plan`), for
the experiments that put it in front of their engines. The settings come from the environment
and `.env`, as for `kvlab proxy`; it serves with PROXY_WORKERS processes (`--workers`) until
SIGTERM or Ctrl-C, and says on stderr where it listens once it does.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from pydantic import ValidationError

from kvlab.core import KvlabError, embedded, load_settings
from kvlab.proxy.app import serve
from kvlab.proxy.args import ProxyArgs
from kvlab.proxy.config import ProxyConfig
from kvlab.proxy.workers import serve_workers, spread_note


def _ready(config: ProxyConfig) -> None:
    print(f"kvlab proxy: listening on port {config.port} ({config.connector}, {config.balance},"
          f" {config.workers} worker(s))", file=sys.stderr, flush=True)


async def _one(config: ProxyConfig) -> None:
    """One process serving until SIGTERM or Ctrl-C."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await serve(config, lambda app: _ready(config), stop)


def _parsed(argv: list[str]) -> tuple[str, str | None, int | None]:
    """(ARGS_JSON, --host, --port) of the command line; SystemExit 2 on anything else."""
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.proxy", description="`kvlab proxy` is the command to type.")
    parser.add_argument("args_json")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    found = parser.parse_args(argv)
    return found.args_json, found.host, found.port


def main(argv: list[str]) -> int:
    given, host, port = _parsed(argv)
    try:
        args = ProxyArgs.model_validate_json(given).model_copy(
            update={k: v for k, v in (("host", host), ("port", port)) if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"kvlab: proxy arguments: {'.'.join(map(str, first['loc'])) or 'the JSON'}: "
              f"{first['msg']}", file=sys.stderr)
        return 2
    try:
        loaded = load_settings(None, args.overrides(), profile_values=embedded)
        config = args.config(loaded.values)
        if config.workers > 1 and not spread_note(config.workers):
            serve_workers(config, lambda url, agreement: _ready(config))
        else:
            asyncio.run(_one(config))
    except KvlabError as exc:
        print(f"kvlab: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
