#!/usr/bin/env python3
"""A file that works as the seed's LOAD_TEST: `python3 FILE --base-url ... --labbook ...`.

run-load.sh runs LOAD_TEST with whatever `python3` is on PATH, which usually lacks kvlab and
its dependencies. So this file uses the standard library only: it finds the interpreter kvlab
is installed in and replaces itself with `<that python> -m kvlab load <the same arguments>`.
`kvlab load --print-load-test-path` writes a copy under KVLAB_HOME with that interpreter
written into it and prints the copy's path; the environment variable KVLAB_PYTHON overrides it.

Deliberately nothing else: no parsing of the arguments (kvlab load accepts exactly what
run-load.sh passes), no imports beyond os and sys.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

KVLAB_PYTHON = ""  # written into the copy by `kvlab load --print-load-test-path`
LAUNCHER_NAME = "load-test.py"


def interpreter() -> str | None:
    """The Python that has kvlab: KVLAB_PYTHON, the one written in, or this one if it has it."""
    for candidate in (os.environ.get("KVLAB_PYTHON", ""), KVLAB_PYTHON):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    import importlib.util

    return sys.executable if importlib.util.find_spec("kvlab") is not None else None


def write_launcher(home: Path, python: str) -> Path:
    """A copy of this file under `home`/bin with `python` written in; returns its path."""
    source = Path(__file__).read_text(encoding="utf-8")
    filled = source.replace('KVLAB_PYTHON = ""', f"KVLAB_PYTHON = {python!r}", 1)
    target = home / "bin" / LAUNCHER_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(filled, encoding="utf-8")
    tmp.chmod(0o755)
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    python = interpreter()
    if python is None:
        sys.stderr.write("kvlab: cannot find the Python kvlab is installed in; run "
                         "`kvlab load --print-load-test-path` and use the path it prints, "
                         "or set KVLAB_PYTHON\n")
        sys.exit(2)
    # replacing this process keeps run-load.sh's exit status and signals exactly kvlab's
    os.execv(python, [python, "-m", "kvlab", "load", *args])  # noqa: S606 - argv, no shell


if __name__ == "__main__":
    main()
