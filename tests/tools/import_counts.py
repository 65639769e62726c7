"""Counts of how kvlab's modules reach across packages, printed for a person and asserted by
`tests/unit/test_architecture.py`: module pairs importing across packages, engine subpackages
imported outside `engines/`, modules over the line limit.

Run it alone: `python tests/tools/import_counts.py` (add `--detail` for every edge counted).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kvlab"
ENGINE_PACKAGES = ("vllm", "llamacpp", "mlx")
LINE_LIMIT = 500


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    return {".".join(p.relative_to(src.parent).with_suffix("").parts).removesuffix(".__init__"):
            p for p in src.rglob("*.py")}


def imports_of(name: str, path: Path, names: dict[str, Path]) -> set[str]:
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


def graph(src: Path = SRC) -> dict[str, set[str]]:
    names = modules(src)
    return {name: imports_of(name, path, names) for name, path in names.items()}


def package_of(module: str) -> str:
    """The top package a module belongs to (`kvlab.engines.vllm.facts` -> `engines`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def engine_package(module: str) -> str | None:
    """The engine subpackage a module lies in (`kvlab.engines.vllm.facts` -> `vllm`)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "engines" and parts[2] in ENGINE_PACKAGES:
        return parts[2]
    return None


def named_for(module: str, engine: str) -> bool:
    """Whether a module exists for one engine alone and says so in its name: one of the
    words of its name is the engine's (`cli/llama_cmd.py` and `report/console_llama.py` for
    llamacpp, `experiments/mlx_cache.py` for mlx)."""
    words = module.rpartition(".")[2].split("_")
    return {"vllm": "vllm", "llamacpp": "llama", "mlx": "mlx"}[engine] in words


def offered(src: Path = SRC) -> dict[str, str]:
    """The modules a package's surface offers as namespaces (`from kvlab.records import rows`,
    listed in its `__init__`'s `__all__`), each mapped to the surface."""
    found = {}
    for init in src.glob("*/__init__.py"):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        names = {e.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", "") == "__all__" for t in node.targets)
                 and isinstance(node.value, ast.List) for e in node.value.elts
                 if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        package = f"kvlab.{init.parent.name}"
        found |= {f"{package}.{n}": package for n in names
                  if (init.parent / f"{n}.py").is_file()}
    return found


@dataclass(frozen=True)
class Counts:
    cross_pairs: list[tuple[str, str]]
    surface_pairs: list[tuple[str, str]]  # with an offered namespace module counted as its surface
    engine_leaks: list[tuple[str, str]]
    oversized: list[tuple[str, int]]
    files: int
    lines: int


def count(src: Path = SRC) -> Counts:
    edges = graph(src)
    cross = sorted((a, b) for a, deps in edges.items() for b in deps
                   if package_of(a) != package_of(b))
    door = offered(src)
    surface = sorted({(a, door.get(b, b)) for a, b in cross})
    leaks = sorted((a, b) for a, deps in edges.items() for b in deps
                   if (e := engine_package(b)) and package_of(a) != "engines"
                   and not named_for(a, e))
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines())
             for name, path in modules(src).items()}
    big = sorted(((n, s) for n, s in sizes.items() if s > LINE_LIMIT), key=lambda x: -x[1])
    return Counts(cross, surface, leaks, big, len(sizes), sum(sizes.values()))


def main(argv: list[str]) -> int:
    c = count()
    print(f"files {c.files}, lines {c.lines}")
    print(f"module pairs importing across packages: {len(c.cross_pairs)}; counting a namespace "
          f"module a package's surface offers as that surface: {len(c.surface_pairs)}")
    print(f"engine subpackages imported outside engines/ by modules not named for them: "
          f"{len(c.engine_leaks)}")
    print(f"modules over {LINE_LIMIT} lines: {len(c.oversized)}")
    for name, size in c.oversized:
        print(f"  {name} {size}")
    if "--detail" in argv:
        by_target = Counter(b for _, b in c.cross_pairs)
        print("most imported across packages:")
        for target, n in by_target.most_common(40):
            print(f"  {n:4d} {target}")
        for a, b in c.engine_leaks:
            print(f"  leak: {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
