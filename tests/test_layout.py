"""The source tree's shape, checked: the import rule between the subpackages, module sizes, and no
package-level sprawl. The rule: kernels <- layers <- fast <- families; runtime <- api <- stream (the streamed
request); the command line uses only the public API (`import vaeshard`, and `vaeshard.metrics` for
the service). config.py, tuning.py and metrics.py are leaves everyone above may read."""

from __future__ import annotations

import ast
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
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
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
        shadowing += sorted(n for n in names if n in sys.modules and n != "tests"
                            and not str(getattr(sys.modules[n], "__file__", "") or "").startswith(str(repo)))
        sees_installed = importlib.util.find_spec("torch") is not None  # the filtered path still finds packages
    finally:
        sys.path[:] = saved
    assert sees_installed
    assert not shadowing, f"tests/ or benchmarks/ names that an installed package also has: {shadowing}"
