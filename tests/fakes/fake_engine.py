"""A process that behaves like an engine at start: serves /health, or dies, or ignores TERM.

Usage: python fake_engine.py PORT [--die] [--child] [--ignore-term]
  --die          print a few log lines and exit 3 before serving
  --child        spawn a sleeping helper process in the same process group
  --ignore-term  ignore SIGTERM (stop must fall back to SIGKILL)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        return


def main() -> None:
    port = int(sys.argv[1])
    flags = set(sys.argv[2:])
    print("fake engine starting", flush=True)
    if "--die" in flags:
        print("loading model", flush=True)
        print("RuntimeError: no model here", flush=True)
        sys.exit(3)
    if "--ignore-term" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--child" in flags:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    time.sleep(0.3)
    HTTPServer(("127.0.0.1", port), Health).serve_forever()


if __name__ == "__main__":
    main()
