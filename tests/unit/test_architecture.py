"""The layout's promises, checked: engine names are compared only inside `engines/`."""

from __future__ import annotations

import re
from pathlib import Path

import kvlab

SRC = Path(kvlab.__file__).parent
# a comparison with an engine's name as a string: == "vllm", != 'llama.cpp', in ("llamacpp", ...
_NAME_TEST = re.compile(r"""(==|!=|\bin)\s*[\(\[{]?\s*["'](vllm|llama\.cpp|llamacpp)["']""")


def test_no_engine_name_comparisons_outside_engines() -> None:
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).parts[0] == "engines":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _NAME_TEST.search(line):
                offenders.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_top_level_holds_only_the_package_entry_points() -> None:
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py"]
