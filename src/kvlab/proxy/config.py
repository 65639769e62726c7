"""What one proxy runs with, built from settings and flags.

Defaults follow the seed's `run-proxy.sh`: prefill at PREFILL_HOST:PREFILL_PORT, decode at
DECODE_HOST:DECODE_PORT (an empty host is loopback; PREFILL_HOSTS and DECODE_HOSTS give a leg
per listed host, at the same ports), listening on SERVE_HOST:PROXY_PORT
(127.0.0.1 unless changed). Timeouts and what a client may send and hold (`ClientLimits`)
come from the PROXY_* settings. The bearer key clients must send is read from the variable
PROXY_API_KEY_ENV names; the key the engines expect, from the one LOADTEST_API_KEY_ENV names.
Neither is ever shown: both fields are left out of `repr` and `summary()`. A proxy that
listens beyond loopback with no client key is not refused (a lab may want that), but
`exposure_warning()` says so on every start. One engine given as both a prefill and a decode
leg is refused: decode would serve itself from its own prefix cache and nothing would cross.

Plain replicas (`replicas=`, `kvlab proxy --replica URL`): no prefill leg; each request goes
whole to one replica, chosen by `balance`. Prefix affinity reads the model's tokenizer
(`tokenizer`: its directory or tokenizer.json; MODEL by default) and hashes the leading
`affinity_blocks` blocks of `block_tokens` tokens; `load_factor` bounds how far above the mean
in-flight count affinity may load one leg (`affinity.py`). `picks_path`: every routing choice
appended there as a JSON line (`legs.PickLog`), for a run that joins them to its requests.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvlab.core import Connector, ConnectorName, SettingError, Settings, connectors
from kvlab.engines import local
from kvlab.proxy import affinity
from kvlab.proxy.legs import Balance, Keyer, PickLog, check_legs
from kvlab.proxy.limits import ClientLimits
from kvlab.proxy.upstream import parse_url

CompatCheck = Callable[[list[str], list[str]], Awaitable[object]]


@dataclass(frozen=True)
class ProxyConfig:
    """One proxy: its legs, where it listens, how long it waits, who may call it."""

    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    connector: ConnectorName = connectors.DEFAULT
    balance: Balance = "round-robin"
    connect_timeout_s: float = 5.0
    prefill_timeout_s: float = 300.0
    decode_timeout_s: float = 600.0
    limits: ClientLimits = field(default_factory=ClientLimits)
    api_key: str = field(default="", repr=False)
    upstream_key: str = field(default="", repr=False)
    bootstrap_port: int | None = None  # prefill's bootstrap server; None: the connector's
    workers: int = 1  # processes sharing the port (workers.py); 1 serves in this process
    tokenizer: str = ""  # the model's tokenizer.json or directory (prefix affinity)
    affinity_blocks: int = affinity.DEFAULT_BLOCKS
    block_tokens: int = affinity.DEFAULT_BLOCK_TOKENS
    load_factor: float = affinity.DEFAULT_LOAD_FACTOR
    picks_path: str = ""  # append every routing choice here ("" = none)
    # the start-up agreement check; None skips it (tests of the proxy alone)
    compat: CompatCheck | None = check_legs

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise SettingError(f"PROXY_WORKERS={self.workers}: give 1 or more worker processes")
        connectors.get(self.connector)  # SettingError naming the choices
        if not self.decode:
            raise SettingError("no decode engine or replica given: pass --decode URL or "
                               "--replica URL")
        if self.load_factor < 1:
            raise SettingError(f"--load-factor {self.load_factor}: give 1 or more (1.25 lets "
                               "a replica hold a quarter more than the mean)")
        if self.balance == "prefix-affinity" and not self.tokenizer:
            raise SettingError("--balance prefix-affinity needs the model's tokenizer: give "
                               "--tokenizer DIR (the model directory) or set MODEL to one")
        for url in (*self.prefill, *self.decode):
            parse_url(url)
        both = same_instance(self.prefill, self.decode)
        if both:
            raise SettingError(
                f"{both} is both a prefill and a decode leg: decode would serve the prompt from "
                "its own prefix cache and nothing would cross; give the prefill and decode "
                "engines' own URLs (--prefill, --decode, or PREFILL_PORT and DECODE_PORT)")

    @functools.cached_property
    def kv(self) -> Connector:
        """The connector the legs run: how the proxy hands a request from prefill to decode."""
        return connectors.get(self.connector)

    @property
    def replicas(self) -> bool:
        """Plain replicas: no prefill leg, each request served whole by one engine."""
        return not self.prefill

    def keyer(self) -> Keyer | None:
        """The affinity key of a request body for this balance (None: no affinity); the
        tokenizer is read here, once per proxy process."""
        if self.balance == "prefix-affinity":
            return affinity.PrefixKey(affinity.load_tokenizer(self.tokenizer),
                                      self.block_tokens, self.affinity_blocks)
        if self.balance == "conversation-affinity":
            return affinity.conversation_key
        return None

    def pick_log(self) -> PickLog | None:
        return PickLog(self.picks_path) if self.picks_path else None

    async def check_legs(self) -> object:
        """The start-up agreement check's result (None when `compat` skips it)."""
        if self.compat is None:
            return None
        return await self.compat(self.urls["prefill"], self.urls["decode"])

    @property
    def urls(self) -> dict[str, list[str]]:
        return {"prefill": [parse_url(u)[2] for u in self.prefill],
                "decode": [parse_url(u)[2] for u in self.decode]}

    def summary(self) -> dict[str, object]:
        """What a person (or --json) should see; never a key."""
        lim = self.limits
        return {**self.urls, "listen": listen_url(self.host, self.port),
                "connector": "none (plain replicas)" if self.replicas else self.connector,
                "balance": self.balance,
                "timeouts_s": {"connect": self.connect_timeout_s,
                               "prefill": self.prefill_timeout_s,
                               "decode_read": self.decode_timeout_s,
                               "client_head": lim.head_timeout_s,
                               "client_keepalive": lim.keepalive_timeout_s,
                               "client_stall": lim.stall_timeout_s},
                "max_body_bytes": lim.max_body_bytes, "max_head_bytes": lim.max_head_bytes,
                "max_connections_per_worker": lim.max_connections, "workers": self.workers,
                "client_key": "required" if self.api_key else "none"}

    def exposure_warning(self) -> str | None:
        """One line when the proxy listens beyond loopback and asks clients for no key."""
        if self.api_key or loopback(self.host):
            return None
        return (f"the proxy listens on {self.host} (beyond this machine) and asks clients for "
                "no key: anyone who reaches it can use the engines; set PROXY_API_KEY_ENV, or "
                "SERVE_HOST=127.0.0.1")

    @classmethod
    def from_settings(cls, settings: Settings, prefill: tuple[str, ...] = (),
                      decode: tuple[str, ...] = (), ignore: tuple[str, ...] = (), *,
                      host: str | None = None, port: int | None = None,
                      balance: Balance | None = None, workers: int | None = None,
                      decode_timeout_s: float | None = None, replicas: tuple[str, ...] = (),
                      tokenizer: str | None = None, picks_path: str = "",
                      load_factor: float | None = None) -> ProxyConfig:
        """A config from settings; repeated --prefill/--decode URLs replace the defaults, and
        each keyword given (not None) its setting. `replicas`: plain replicas instead of
        prefill and decode legs.

        `ignore`: compatibility fields the start-up check leaves out (as `kvlab check`)."""
        if replicas and (prefill or decode):
            raise SettingError("--replica serves plain replicas: give it without --prefill "
                               "and --decode")
        # the engines protect /v1/* with the key the load generator also uses
        auth = {"Authorization": f"Bearer {settings.api_key()}"} if settings.api_key() else None
        return cls(
            prefill=() if replicas else prefill or _default_legs(settings, "prefill"),
            decode=replicas or decode or _default_legs(settings, "decode"),
            host=settings.serve_host if host is None else host,
            port=settings.proxy_port if port is None else port,
            connector=settings.connector, balance=balance or "round-robin",
            connect_timeout_s=settings.proxy_connect_timeout_s,
            prefill_timeout_s=settings.proxy_prefill_timeout_s,
            decode_timeout_s=(settings.proxy_decode_timeout_s if decode_timeout_s is None
                              else decode_timeout_s),
            limits=ClientLimits(
                max_body_bytes=settings.proxy_max_body_bytes,
                max_request_line_bytes=settings.proxy_max_request_line_bytes,
                max_header_bytes=settings.proxy_max_header_bytes,
                max_headers=settings.proxy_max_headers,
                max_head_bytes=settings.proxy_max_head_bytes,
                head_timeout_s=settings.proxy_head_timeout_s,
                keepalive_timeout_s=settings.proxy_keepalive_timeout_s,
                stall_timeout_s=settings.proxy_client_stall_timeout_s,
                max_connections=settings.proxy_max_connections),
            workers=settings.proxy_workers if workers is None else workers,
            api_key=client_key(settings), upstream_key=settings.api_key(),
            compat=functools.partial(check_legs, headers=auth, ignore=ignore),
            tokenizer=settings.model if tokenizer is None else tokenizer,
            picks_path=picks_path,
            load_factor=affinity.DEFAULT_LOAD_FACTOR if load_factor is None else load_factor,
        )


def same_instance(prefill: tuple[str, ...], decode: tuple[str, ...]) -> str | None:
    """A URL given as both a prefill and a decode leg: one process listening on this machine
    (its session and start time, whatever address names it), else one host and port
    (localhost and 127.0.0.1 are one). A forwarder to another address is found by the
    start-up check's counters (`legs.check_identity`)."""
    def key(url: str) -> tuple[str, int]:
        host, port, full = parse_url(url)
        # one process may serve several ports (a test's fakes): its socket is the engine
        return local.listening_instance(full) or (
            "127.0.0.1" if host == "localhost" else host), port

    decoders = {key(u) for u in decode}
    return next((parse_url(u)[2] for u in prefill if key(u) in decoders), None)


def loopback(host: str) -> bool:
    """Whether binding `host` keeps the proxy on this machine (a name other than
    localhost counts as beyond: it may resolve to any interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_url(host: str, port: int) -> str:
    """Where the proxy listens, as bound (0.0.0.0 stays 0.0.0.0)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def client_key(settings: Settings) -> str:
    """The bearer key clients must present; refused when the named variable is empty."""
    name = settings.proxy_api_key_env
    if not name:
        return ""
    key = os.environ.get(name, "")
    if not key:
        raise SettingError(f"PROXY_API_KEY_ENV names {name}, but {name} is empty or unset; "
                           f"export {name} or clear PROXY_API_KEY_ENV")
    return key


def _default_legs(settings: Settings, side: str) -> tuple[str, ...]:
    """`side`'s engines as the seed's run-proxy.sh finds them: each PREFILL_HOSTS name (else
    PREFILL_HOST; empty is loopback) at PREFILL_PORT, and so for decode."""
    port = settings.prefill_port if side == "prefill" else settings.decode_port
    return tuple(f"{host}:{port}" for host in settings.hosts(side) or ("127.0.0.1",))
