"""Which kvlab this is: its version (`kvlab --version`, every notebook line, a slot file's
manifest, the check that every Ray node runs the same kvlab) and the schema of the notebook
record envelope it writes. `kvlab.__version__` and `kvlab.SCHEMA` are these."""

from importlib.metadata import PackageNotFoundError, version


def _source_version() -> str:
    """The version in pyproject.toml, for a source tree run without installing it."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0.0.0+unknown"


try:
    VERSION = version("kvlab")
except PackageNotFoundError:  # a source tree on PYTHONPATH (the GPU machine has no pip index)
    VERSION = _source_version()

SCHEMA = 3
"""Version of the notebook record envelope kvlab writes."""
