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
                "generation_config.json")


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
            try:
                return list(psutil.Process(conn.pid).cmdline())
            except (psutil.Error, OSError):
                return None
    return None


def content_digest(path: str | None) -> str | None:
    """A short digest of a model's content (a directory or one file); None when unreadable."""
    if not path:
        return None
    where = Path(path)
    try:
        if where.is_file():
            files = [where]
        elif where.is_dir():
            files = sorted(p for p in where.iterdir() if p.is_file() and (
                p.name in CONFIG_FILES or p.suffix in WEIGHT_SUFFIXES))
        else:
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
