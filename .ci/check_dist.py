"""The package builds as a wheel and an sdist, each holding every module of src/vaeshard, and the wheel
declares the `vaeshard` command: a release is one build away.

Offline and quick: the build runs with the setuptools already installed (no build isolation, nothing
downloaded), on a copy of the package's files in a temporary folder, so the checkout gets no build/
or egg-info from it.

    python3 .ci/check_dist.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("pyproject.toml", "README.md")  # what the build reads besides src/


def main() -> int:
    modules = sorted(
        str(p.relative_to(ROOT / "src"))
        for p in (ROOT / "src" / "vaeshard").rglob("*.py")
        if "__pycache__" not in p.parts
    )
    with tempfile.TemporaryDirectory(prefix="vaeshard-dist-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "dist"
        shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in FILES:
            shutil.copy(ROOT / name, tree / name)
        # pip's own wheel build, and the sdist through the same backend's PEP 517 hook
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-q",
                "-w",
                str(out),
                str(tree),
            ],
            check=True,
        )
        subprocess.run(
            [sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(out)!r})"],
            check=True,
            cwd=tree,
            stdout=subprocess.DEVNULL,
        )
        (wheel,) = out.glob("vaeshard-*.whl")
        (sdist,) = out.glob("vaeshard-*.tar.gz")
        with zipfile.ZipFile(wheel) as z:
            in_wheel = set(z.namelist())
            entry_points = next((z.read(n).decode() for n in in_wheel if n.endswith(".dist-info/entry_points.txt")), "")
        with tarfile.open(sdist) as t:
            in_sdist = {name.split("/", 1)[1] for name in t.getnames() if "/" in name}
        problems = [f"wheel lacks {m}" for m in modules if m not in in_wheel]
        problems += [f"sdist lacks src/{m}" for m in modules if f"src/{m}" not in in_sdist]
        if "vaeshard = vaeshard.cli:entry" not in entry_points:
            problems.append("the wheel declares no `vaeshard` command (entry_points.txt)")
        for problem in problems:
            print(f"check_dist: {problem}", file=sys.stderr)
        if not problems:
            print(f"check_dist: {wheel.name} and {sdist.name} hold all {len(modules)} modules")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
