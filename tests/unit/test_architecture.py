"""The layout's promises, checked: engine names compared only inside `engines/`, a top level
with no modules of its own, and no import cycle."""

from __future__ import annotations

import ast
import graphlib
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


def _module_imports() -> dict[str, set[str]]:
    """kvlab module -> the kvlab modules it imports at load time (not inside functions, not
    under TYPE_CHECKING)."""
    names = {".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"):
             p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvlab"):
                module = str(node.module)
                deps |= {f"{module}.{a.name}" if f"{module}.{a.name}" in names else module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("kvlab")}
        graph[name] = {d for d in deps if d in names and d != name}
    return graph


def test_no_import_cycle_at_load_time() -> None:
    graphlib.TopologicalSorter(_module_imports()).prepare()  # raises CycleError on a cycle
