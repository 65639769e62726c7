"""What one client may send and hold, and how the proxy notices when clients push past it.

- `ClientLimits`: the request head's limits (request line, one header line, header count,
  the whole head), the body limit, the head/body read timeout, the idle keep-alive timeout,
  how long a client may leave a response unread, and the connection cap per worker. Each
  refusal names the setting that decided it (PROXY_*).
- `HeadMeter`: counts a request head as it arrives, before the parser sees the bytes, so an
  endless header or request line is cut at its limit instead of growing the parser's buffer
  (httptools concatenates a header's pieces: an unbounded one costs quadratic time). The
  count is exact however the bytes are split into reads, except for a head that arrives in
  the same read as the end of a chunked body before it: its first bytes (at most that read)
  go uncounted.
- `raise_file_limit` and `connection_cap`: the soft RLIMIT_NOFILE raised to the hard limit,
  and the cap lowered below what the file limit can hold (a client socket plus its legs).
- `Notices`: a warning that can repeat per connection is logged once, then at most once a
  minute per kind, with the count of the ones not logged.

It does no I/O beyond logging and getrlimit/setrlimit; `server.py` applies all of it.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("kvlab.proxy")

FD_RESERVE = 64  # files the proxy needs besides clients and legs (logs, metrics, listeners)
FDS_PER_CLIENT = 3  # the client socket, its leg in flight, and one idle pooled leg
NOFILE_CEILING = 1 << 20  # when the hard limit is unlimited: Linux's default fs.nr_open
HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True)
class ClientLimits:
    """Limits on each client connection (defaults: nginx's and uvicorn's, roughly)."""

    max_body_bytes: int = 16 * 2**20
    max_request_line_bytes: int = 8192
    max_header_bytes: int = 8192  # one header line
    max_headers: int = 100
    max_head_bytes: int = 64 * 1024  # request line and every header together
    head_timeout_s: float = 10.0  # a head must arrive in this; a body may pause this long
    keepalive_timeout_s: float = 60.0  # above aiohttp's 15 s, so the client closes first
    stall_timeout_s: float = 60.0  # a response left unread this long ends the connection
    max_connections: int = 4096  # per worker process

    def sweep_every_s(self) -> float:
        """How often deadlines are checked: a quarter of the shortest, at most 1 s."""
        shortest = min(self.head_timeout_s, self.keepalive_timeout_s, self.stall_timeout_s)
        return max(0.01, min(1.0, shortest / 4))


@dataclass(frozen=True)
class Refusal:
    """A response that refuses a request before any handler sees it, then closes."""

    status: int
    message: str
    kind: str
    extra: bytes = b""  # pre-rendered header lines


class HeadMeter:
    """The head in progress: bytes, lines, the current line's length, its last bytes."""

    __slots__ = ("_shortest", "limits", "line_len", "line_no", "tail", "used")

    def __init__(self, limits: ClientLimits) -> None:
        self.limits = limits
        self._shortest = min(limits.max_request_line_bytes, limits.max_header_bytes)
        self.reset()

    def reset(self) -> None:
        self.used = 0
        self.line_no = 0  # 0: the request line
        self.line_len = 0
        self.tail = b""  # up to 3 bytes, so an end of head split across reads is found

    def take(self, data: bytes) -> tuple[int, Refusal | None]:
        """How many bytes of `data` to parse as this head (up to its end); and a refusal
        when the head breaks a limit (parse those bytes first: the parser may name a more
        precise one)."""
        limits = self.limits
        room = limits.max_head_bytes - self.used
        window = data[:room]
        end = (self.tail + window).find(HEAD_END)
        if end >= 0:
            window = data[:end + len(HEAD_END) - len(self.tail)]
            if self.used + len(window) <= self._shortest:  # the usual head: short, whole
                return len(window), None  # (reset() follows once the parser has it)
        refusal = self._lines(window)
        if refusal is not None:
            return 0, refusal
        self.used += len(window)
        self.tail = (self.tail + window)[-3:]
        if end < 0 and len(data) > room:
            return len(window), Refusal(
                400, f"the request head is larger than {limits.max_head_bytes} bytes "
                     "(PROXY_MAX_HEAD_BYTES)", "request_head_too_large")
        return len(window), None

    def _lines(self, piece: bytes) -> Refusal | None:
        """Check every line `piece` completes, and the one in progress, against its limit.

        A line's length leaves out its CRLF; the line in progress may end with its CR, so
        it is refused one byte later than a complete one: the verdict on a head does not
        depend on how it was split into reads."""
        last = piece.rfind(b"\n")
        if last < 0:
            self.line_len += len(piece)
            return self._check(self.line_no, self.line_len - 1)
        if self.line_len + last >= self._shortest:  # else no complete line can be too long
            lengths = [len(line) - 1 for line in piece[:last].split(b"\n")]
            lengths[0] += self.line_len
            for i, length in enumerate(lengths):
                if (refusal := self._check(self.line_no + i, length)) is not None:
                    return refusal
        self.line_no += piece.count(b"\n", 0, last + 1)
        self.line_len = len(piece) - last - 1
        return self._check(self.line_no, self.line_len - 1)

    def _check(self, line_no: int, length: int) -> Refusal | None:
        limits = self.limits
        if line_no == 0:
            return url_too_long(limits) if length > limits.max_request_line_bytes else None
        return header_too_long(limits) if length > limits.max_header_bytes else None


def url_too_long(limits: ClientLimits) -> Refusal:
    return Refusal(414, f"the request line is longer than {limits.max_request_line_bytes} "
                        "bytes (PROXY_MAX_REQUEST_LINE_BYTES)", "uri_too_long")


def header_too_long(limits: ClientLimits) -> Refusal:
    return Refusal(431, f"a header line is longer than {limits.max_header_bytes} bytes "
                        "(PROXY_MAX_HEADER_BYTES)", "request_header_fields_too_large")


def too_many_headers(limits: ClientLimits) -> Refusal:
    return Refusal(431, f"the request has more than {limits.max_headers} header lines "
                        "(PROXY_MAX_HEADERS)", "request_header_fields_too_large")


def raise_file_limit() -> int:
    """Raise the soft limit on open files to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a container may refuse; keep what we have
            pass
    return NOFILE_CEILING if soft == resource.RLIM_INFINITY else soft


def connection_cap(wanted: int, open_files: int) -> int:
    """The client connections one worker takes: `wanted`, or fewer if files run out first."""
    return max(1, min(wanted, (open_files - FD_RESERVE) // FDS_PER_CLIENT))


class Notices:
    """Warnings that can repeat fast: the first of a kind at once, then one per `every_s`."""

    def __init__(self, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self.last: dict[str, float] = {}
        self.missed: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> bool:
        """Log `message` unless one of this kind was logged less than `every_s` ago."""
        now = self.clock()
        last = self.last.get(kind)
        if last is not None and now - last < self.every_s:
            self.missed[kind] = self.missed.get(kind, 0) + 1
            return False
        missed = self.missed.pop(kind, 0)
        more = f" ({missed} more since the last such line)" if missed else ""
        log.warning("%s%s", message, more)
        self.last[kind] = now
        return True
