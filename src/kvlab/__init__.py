"""kvlab: measure and prove KV-cache reuse on your own machines."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvlab")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

SCHEMA = 1
"""Version of the notebook record envelope kvlab writes."""
