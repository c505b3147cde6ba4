"""The source tree's shape, checked: the import rule between the subpackages, no import cycle, no
module reading another's underscore names, module sizes, and no package-level sprawl. The rule:
kernels <- layers <- fast <- families; runtime <- api <- stream (the streamed request); the command line
uses only the public API (`import vaeshard`, and `vaeshard.metrics` for the service). config.py,
tuning.py and metrics.py are leaves everyone above may read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vaeshard"

# what each part of the package may import of vaeshard (besides itself)
ALLOWED = {
    "kernels": set(),
    "runtime": {"config", "tuning"},
    "layers": {"kernels", "runtime", "config", "tuning"},
    "fast": {"kernels", "layers", "runtime", "config", "tuning"},
    "families": {"fast", "layers", "runtime", "kernels", "config", "tuning"},
    "policy": {"families", "fast", "layers", "runtime", "config", "tuning"},
    "api": {"families", "layers", "runtime", "kernels", "policy", "config", "tuning", "metrics"},
    "stream": {"api", "families", "layers", "runtime", "config", "tuning", "metrics"},
    "metrics": set(),
    "cli": {"(public)"},
    "config": {"tuning"},  # a knob's default may be a measured value
    "tuning": set(),
    "__init__": {"api", "config", "families", "policy", "runtime", "stream", "metrics"},
    "__main__": {"cli"},
}


def _part(module: str) -> str:
    """The part of the package a dotted module name (vaeshard.x.y) belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(public)"


def _import_target(node: ast.ImportFrom, package: str) -> str:
    """The dotted module a `from ... import` names, its relative dots resolved against `package`."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted vaeshard module) of every import in the file, function-level ones included."""
    rel = path.relative_to(SRC.parent).with_suffix("")
    module = ".".join(rel.parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if path.name == "__init__.py":
        module = module[: -len(".__init__")]
        package = module
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "vaeshard"]
        elif isinstance(node, ast.ImportFrom):
            target = _import_target(node, package)
            if target.split(".")[0] != "vaeshard":
                continue
            for a in node.names:  # a module it names (from . import tier), else the module it names them of
                named = f"{target}.{a.name}"
                found.append((node.lineno, named if _is_module(named) else target))
    return found


def _is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _owner(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_import_follows_the_rule():
    broken = []
    for path in sorted(SRC.rglob("*.py")):
        owner = _owner(path)
        allowed = ALLOWED[owner] | {owner}
        for line, target in _imports(path):
            part = _part(target)
            if part == "(public)" and owner != "cli":
                part = "__init__"
            if target == "vaeshard" and owner == "cli":
                continue
            if part not in allowed and not (owner == "cli" and target in ("vaeshard", "vaeshard.metrics")):
                broken.append(f"{path.relative_to(SRC)}:{line} imports {target} ({owner} may import {sorted(allowed)})")
    assert not broken, "\n".join(broken)


def test_the_command_line_reaches_the_library_only_through_its_public_api():
    for path in sorted((SRC / "cli").rglob("*.py")):
        for line, target in _imports(path):
            public = target in ("vaeshard", "vaeshard.metrics")  # (metrics: documented in docs/metrics.md)
            assert public or target.startswith("vaeshard.cli"), f"{path.name}:{line} imports {target}"


def test_the_rule_is_checked_on_real_imports():
    # the checker sees relative and function-level imports (a rule that cannot fail checks nothing)
    found = dict((t, n) for n, t in _imports(SRC / "layers" / "convs.py"))
    assert "vaeshard.runtime.spatial" in found and "vaeshard.kernels.phases" in found
    assert any(t == "vaeshard.families" for _, t in _imports(SRC / "policy.py"))  # (inside a function)


def test_few_top_level_modules_and_none_too_long():
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= 8, top
    long = [
        f"{p.relative_to(SRC)} ({n} lines)" for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700
    ]
    assert not long, long


def test_the_tests_mirror_the_tree():
    tests = Path(__file__).resolve().parent
    for part in ("runtime", "layers", "kernels", "families", "cli"):
        assert (SRC / part).is_dir() and list((tests / f"test_{part}").glob("test_*.py")), part


def test_no_test_or_benchmark_name_shadows_an_importable_package():
    # A script that puts tests/ or benchmarks/ first on sys.path (as a rank script or runpy does) would
    # import such a folder or module instead of the installed package of that name: `kernels`, which
    # diffusers imports through transformers, was once a test folder.
    import importlib.util
    import sys

    repo = Path(__file__).resolve().parents[1]
    names = set()
    for folder in (repo / "tests", repo / "benchmarks"):
        names |= {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
        names |= {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    ours = {str(repo), str(repo / "tests"), str(repo / "benchmarks"), "", "."}
    saved = sys.path[:]
    try:
        sys.path[:] = [p for p in sys.path if str(Path(p).resolve()) not in ours and p not in ours]
        shadowing = sorted(n for n in names if n not in sys.modules and importlib.util.find_spec(n) is not None)
        shadowing += sorted(
            n
            for n in names
            if n in sys.modules
            and n != "tests"
            and not str(getattr(sys.modules[n], "__file__", "") or "").startswith(str(repo))
        )
        sees_installed = importlib.util.find_spec("torch") is not None  # the filtered path still finds packages
    finally:
        sys.path[:] = saved
    assert sees_installed
    assert not shadowing, f"tests/ or benchmarks/ names that an installed package also has: {shadowing}"


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if path.name == "__init__.py" else rel.parts
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """vaeshard module -> the vaeshard modules it imports (function-level imports included; those under
    `if TYPE_CHECKING:`, which never run, not)."""
    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        typing_only = _type_checking_lines(path.read_text())
        graph[module] = {target for line, target in _imports(path) if target != module and line not in typing_only}
    return graph


def _type_checking_lines(source: str) -> set[int]:
    """The lines of the imports inside `if TYPE_CHECKING:` blocks (read by type checkers, never run)."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for inner in node.body:
                lines |= {n.lineno for n in ast.walk(inner) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: each group of modules that reach one another (Tarjan's strongly
    connected components of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycles():
    # a cycle makes a module's names depend on which of its modules was imported first; a function-level
    # import only hides one (its module is still half-made when a caller first runs it)
    cycles = _cycles(_import_graph())
    assert not cycles, "modules that import one another:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _private_uses(path: Path) -> list[str]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    return [f"{path.relative_to(SRC)}:{use}" for use in _private_uses_in(path.read_text(), module, package)]


def _private_uses_in(source: str, module: str, package: str) -> list[str]:
    """`from X import _name` and `X._name` in `source` (module `module` of `package`), where X is another
    vaeshard module or a name imported from one: a module's underscore names are its own."""
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # local name -> the vaeshard module it names or came from
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _import_target(node, package)
            if target.split(".")[0] != "vaeshard":
                continue
            for a in node.names:
                named = f"{target}.{a.name}"
                imported[a.asname or a.name] = named if _is_module(named) else target
                if _private(a.name) and target != module and not _is_module(named):
                    found.append(f"{node.lineno} imports {a.name} from {target}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vaeshard":
                    imported[a.asname or "vaeshard"] = a.name if a.asname else "vaeshard"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
            if imported.get(node.value.id, module) != module:
                found.append(f"{node.lineno} uses {node.value.id}.{node.attr} of {imported[node.value.id]}")
    return sorted(found, key=lambda use: int(use.split()[0]))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reaches_into_another_modules_private_names():
    found = [line for path in sorted(SRC.rglob("*.py")) for line in _private_uses(path)]
    assert not found, "\n".join(found)


def test_the_cycle_and_privacy_checks_see_what_they_look_for():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .tile import Ops\nfrom .comm import Comm\n"
    assert _type_checking_lines(typed) == {3}
    seen = _private_uses_in(
        "from . import io\nfrom .bench import _timed, run\nio._umask()\nrun._x\nio.umask()\nfrom .io import __all__",
        "vaeshard.cli.writer",
        "vaeshard.cli",
    )
    assert seen == [
        "2 imports _timed from vaeshard.cli.bench",
        "3 uses io._umask of vaeshard.cli.io",
        "4 uses run._x of vaeshard.cli.bench",
    ], seen
    graph = _import_graph()
    assert "vaeshard.runtime.comm" in graph["vaeshard.runtime.tile"]  # real edges, relative imports resolved
    assert "vaeshard.families" in graph["vaeshard.policy"]  # (inside a function)


def test_each_supported_class_is_named_by_its_family_and_the_registry_only():
    """A diffusers class name appears under src/ only in its family's module (or package) and the
    registry: every other part reads what it needs from them."""
    from vaeshard import families

    files = [p for p in SRC.rglob("*.py")]
    for name, (module, _) in families._REGISTRY.items():
        home = module.split(".")[2]  # vaeshard.families.<home>
        named = {p.relative_to(SRC).as_posix() for p in files if re.search(rf"\b{name}\b", p.read_text())}
        others = {f for f in named if f != "families/__init__.py" and not f.startswith(f"families/{home}")}
        assert not others, f"{name} is named outside its family and the registry: {sorted(others)}"
