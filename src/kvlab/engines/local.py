"""What this machine can say about an engine beyond its HTTP answers: its command line and
the content of the model files it serves.

- `listening_argv(url)`: the command line of the process listening on the URL's port, when
  the URL is this machine's and the process is readable (psutil). An engine's adapter reads
  its own flags from it (dtype, KV type, connector and store path, rope settings) for
  instances kvlab did not start. Another machine's instance, or one this account may not
  inspect, gives None: its facts stay unknown, never guessed.
- `content_digest(path)`: what a model is, by content, not by where it lies: config.json
  (parsed, so key order and whitespace do not count), the tokenizer files, and each weight
  file's size with its first, middle and last MiB. Two unedited copies at two paths give the
  same digest; another seed, dtype or quantisation gives another. Sampling keeps this cheap
  on a 16 GB model; the behavioural fingerprint (`measure/fingerprint.py`) covers the bytes
  the sample skips.

This module knows no engine.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

SAMPLE_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
CONFIG_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json", "chat_template.jinja")
SHOWN_CHARS = 60  # of a differing value, in a message
# where a model keeps its chat template, as `content_differences` names a part: the file, or
# a JSON file's key (what it renders is compared apart, as the server's template tokens)
TEMPLATE_PARTS = frozenset({("chat_template.jinja", ""), ("tokenizer_config.json",
                                                          "chat_template")})


def _local_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if address.is_loopback or address.is_unspecified:
        return True
    import psutil

    mine = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(address) in mine


NOT_READ = ("not compared: the command line of the process on {url} could not be read "
            "({why}), so its KV types, numerics flags and prompt caching are unknown")


def listening_argv(url: str, notes: list[str] | None = None) -> list[str] | None:
    """The command line of the local process listening on `url`'s port (None: not local,
    nothing listening, or not readable by this account, which `notes` is told)."""
    import psutil

    pid = listening_pid(url, notes)
    if pid is None:
        return None
    try:
        return list(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return None


def instance_id(pid: int | None) -> str | None:
    """Who a local process is, beyond its address: its session (an engine kvlab starts leads
    its own) and that leader's start time, so a restarted engine or a reused pid is another
    instance. None when the process cannot be read."""
    import psutil

    if pid is None:
        return None
    try:
        leader = os.getsid(pid)
        started = psutil.Process(leader).create_time()
    except (psutil.Error, OSError):
        return None
    return f"session {leader} started {started:.2f}"


def listening_instance(url: str) -> str | None:
    """`instance_id` of the local process listening on `url`'s port (None: not here)."""
    return instance_id(listening_pid(url))


def listening_pid(url: str, notes: list[str] | None = None) -> int | None:
    """The pid of the local process listening on `url`'s port (None: not local, nothing
    listening, or not readable by this account, which `notes` is told)."""
    import psutil

    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.hostname is None or not _local_host(parts.hostname):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # macOS lists other processes' sockets only to root
        if notes is not None:
            notes.append(NOT_READ.format(url=url, why="listing sockets needs root on this "
                                         "system, as on macOS"))
        return None
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port \
                and conn.pid:
            return int(conn.pid)
    return None


def _content_files(where: Path) -> list[Path] | None:
    if where.is_file():
        return [where]
    if where.is_dir():
        return sorted(p for p in where.iterdir() if p.is_file() and (
            p.name in CONFIG_FILES or p.suffix in WEIGHT_SUFFIXES))
    return None


def content_digest(path: str | None) -> str | None:
    """A short digest of a model's content (a directory or one file); None when unreadable."""
    if not path:
        return None
    where = Path(path)
    try:
        files = _content_files(where)
        if files is None:
            return None
        digest = hashlib.sha256()
        for file in files:
            # names inside a directory identify roles (config, shard 1 of 4); a lone file's
            # name is only where it lies
            digest.update((file.name if where.is_dir() else "model").encode())
            digest.update(_file_part(file))
        return digest.hexdigest()[:16] if files else None
    except OSError:
        return None


def _file_part(file: Path) -> bytes:
    if file.name.endswith(".json"):
        try:
            return json.dumps(json.loads(file.read_text(encoding="utf-8")),
                              sort_keys=True).encode()
        except ValueError:
            return file.read_bytes()
    size = file.stat().st_size
    with open(file, "rb") as f:
        if size <= 3 * SAMPLE_BYTES:
            return str(size).encode() + f.read()
        parts = [str(size).encode()]
        for offset in (0, size // 2, size - SAMPLE_BYTES):
            f.seek(offset, os.SEEK_SET)
            parts.append(f.read(SAMPLE_BYTES))
        return b"".join(parts)


def content_differences(a: str, b: str) -> list[tuple[str, str, str, str]]:
    """What differs between two models' content, as (file, key, value in a, value in b):
    a JSON file by its keys (nested ones dotted, `rope_scaling.factor`), any other file as a
    whole (key ""; "absent" where one model lacks it). Empty when unreadable."""
    try:
        files_a, files_b = _content_files(Path(a)), _content_files(Path(b))
        if files_a is None or files_b is None:
            return []
        single = len(files_a) == len(files_b) == 1 and Path(a).is_file()
        named_a = {"model" if single else f.name: f for f in files_a}
        named_b = {"model" if single else f.name: f for f in files_b}
        out = []
        for name in sorted(named_a.keys() | named_b.keys()):
            fa, fb = named_a.get(name), named_b.get(name)
            if fa is None or fb is None:
                out.append((name, "", "present" if fa else "absent",
                            "present" if fb else "absent"))
            elif name.endswith(".json"):
                out += [(name, *d) for d in _json_differences(fa, fb)]
            elif _file_part(fa) != _file_part(fb):
                out.append((Path(a).name if single else name, "", "differs", "differs"))
        return out
    except OSError:
        return []


def _json_differences(a: Path, b: Path) -> list[tuple[str, str, str]]:
    try:
        da, db = (json.loads(p.read_text(encoding="utf-8")) for p in (a, b))
    except ValueError:
        return [] if a.read_bytes() == b.read_bytes() else [("", "differs", "differs")]
    fa, fb = _flat(da), _flat(db)
    return [(k, _shown(fa.get(k, _ABSENT)), _shown(fb.get(k, _ABSENT)))
            for k in sorted(fa.keys() | fb.keys()) if fa.get(k, _ABSENT) != fb.get(k, _ABSENT)]


_ABSENT = object()


def _flat(value: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, object] = {}
    for key, inner in value.items():
        out |= _flat(inner, f"{prefix}.{key}" if prefix else str(key))
    return out


def _shown(value: object) -> str:
    if value is _ABSENT:
        return "absent"
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."
