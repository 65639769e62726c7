"""The layout's promises, checked: one rank order of packages that no import runs up (deferred
and TYPE_CHECKING imports included), no import cycle between modules, engine names compared
only inside `engines/`, and a top level with no modules of its own."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import kvlab

SRC = Path(kvlab.__file__).parent
# the README's "How kvlab is built": each package may import only those before it
RANK = ("core", "records", "observe", "engines", "measure", ("loadgen", "proxy"), "cluster",
        "experiments", "report", "cli")
# modules that are one unit: the proxy's front and its HTTP server mirror uvicorn's pair
UNITS = {"kvlab.proxy.front": "kvlab.proxy.server"}
# a comparison with an engine's name as a string: == "vllm", != 'llama.cpp', in ("llamacpp", ...
_NAME_TEST = re.compile(r"""(==|!=|\bin)\s*[\(\[{]?\s*["'](vllm|llama\.cpp|llamacpp)["']""")


def _rank(package: str) -> int:
    for i, entry in enumerate(RANK):
        if package == entry or (isinstance(entry, tuple) and package in entry):
            return i
    raise AssertionError(f"package {package!r} has no place in RANK: add it to the README's "
                         "order and here")


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"):
            p for p in SRC.rglob("*.py")}


def _imports(name: str, path: Path, names: dict[str, Path]) -> set[str]:
    """Every kvlab module `name` imports anywhere in its file: at load time, inside functions,
    under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("kvlab"):
                continue
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in names else base
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kvlab")}
    return {m for m in found if m in names and m != name}


def _graph() -> dict[str, set[str]]:
    names = _modules()
    return {name: _imports(name, path, names) for name, path in names.items()}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (SRC / parts[1]).is_dir()) \
        else None


def test_no_import_runs_up_the_rank_order() -> None:
    upward = []
    for module, deps in sorted(_graph().items()):
        here = _package(module)
        if here is None:
            continue
        for dep in sorted(deps):
            there = _package(dep)
            if there is not None and _rank(there) > _rank(here):
                upward.append(f"{module} imports {dep} ({here} -> {there})")
    assert upward == []


def test_no_import_cycle_between_modules() -> None:
    merged: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        node = UNITS.get(module, module)
        merged.setdefault(node, set()).update(UNITS.get(d, d) for d in deps)
    for node, deps in merged.items():
        deps.discard(node)
    graphlib.TopologicalSorter(merged).prepare()  # raises CycleError naming the cycle


def test_every_package_has_its_rank() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    for package in packages:
        _rank(package)


def test_the_checks_see_a_deferred_and_a_type_checking_import(tmp_path: Path) -> None:
    """The walk counts what the load-time graph would miss (this test cannot pass vacuously)."""
    fake = tmp_path / "kvlab" / "core"
    fake.mkdir(parents=True)
    text = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from kvlab.cli import main\n"
            "def later() -> None:\n    from kvlab.report.common import Table\n")
    (fake / "x.py").write_text(text, encoding="utf-8")
    names = {"kvlab.core.x": fake / "x.py", "kvlab.cli": Path("cli"),
             "kvlab.report.common": Path("common")}
    assert _imports("kvlab.core.x", fake / "x.py", names) == {"kvlab.cli",
                                                               "kvlab.report.common"}


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
