"""Shared fixtures: isolation of settings and notebook per test, the tiny models once; at the
end, no process the suite started left running."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from children import session_leftovers
from kvlab.core.settings import Settings
from kvlab.engines.models import TinyModels, make_tiny

# Settings names that a developer's shell may carry; tests must not see them.
_LEAKY = [name.upper() for name in Settings.model_fields if name != "kvlab_home"]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test runs in its own directory, with no .env and no kvlab settings in the env."""
    for name in _LEAKY:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LABBOOK", str(tmp_path / "labbook.md"))
    yield tmp_path


def kvlab_home() -> Path:
    return Settings().home()


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    """The tiny HF directory and GGUF, built once (cached under KVLAB_HOME)."""
    return make_tiny(kvlab_home() / "models" / "tiny-qwen3-seed0")


@pytest.fixture(scope="session")
def other_tiny_models() -> TinyModels:
    """A second tiny pair with another seed: same shapes, different weights and tokenizer."""
    return make_tiny(kvlab_home() / "models" / "tiny-qwen3-seed1", seed=1)


def pytest_report_header() -> list[str]:
    return [f"kvlab home: {kvlab_home()}", f"cpus: {os.cpu_count()}"]


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    """Collect after each test, so an unclosed socket is blamed on the test that leaked it."""
    yield
    import gc

    gc.collect()


LEAK_WARNING = "WARNING: the suite left processes running; stopped now:"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The safety net behind `children`: whatever the suite started and left running (its
    process tree, and marked processes that left it) is stopped and named, so a leak shows
    rather than outliving the suite. It warns; it does not fail the run."""
    left = session_leftovers()
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
    for line in [LEAK_WARNING, *(f"  {x}" for x in left)]:
        if reporter is not None:
            reporter.write_line(line, yellow=True, bold=True)
        else:
            print(line, file=sys.stderr)
