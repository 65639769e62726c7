"""kvlab: measure and prove KV-cache reuse on your own machines."""

from importlib.metadata import PackageNotFoundError, version


def _source_version() -> str:
    """The version in pyproject.toml, for a source tree run without installing it."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0.0.0+unknown"


try:
    __version__ = version("kvlab")
except PackageNotFoundError:  # a source tree on PYTHONPATH (the GPU machine has no pip index)
    __version__ = _source_version()

SCHEMA = 3
"""Version of the notebook record envelope kvlab writes."""
