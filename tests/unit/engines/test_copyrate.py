"""The copy-rate probe's choice of interpreter and its refusal (#46): the measuring itself runs
in torch on a real interpreter (tests/integration/engines/test_copyrate_live.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvlab.core import EngineError
from kvlab.engines import copyrate


def test_the_engines_interpreter_is_tried_first_and_none_twice() -> None:
    found = copyrate.candidates("/opt/engine/bin/python")
    assert found[0] == "/opt/engine/bin/python" and sys.executable in found
    assert len(found) == len(set(found))
    assert copyrate.candidates(sys.executable)[0] == sys.executable
    assert copyrate.candidates(None)[0] == sys.executable


def test_no_interpreter_with_torch_is_an_error_naming_each(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-python")
    with pytest.raises(EngineError, match="no interpreter with torch") as e:
        copyrate.measure(None, interpreters=[sys.executable, missing])  # kvlab's: no torch
    assert "ModuleNotFoundError" in str(e.value) or "torch" in str(e.value)
    assert missing in str(e.value)
