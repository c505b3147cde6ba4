"""The documents match the code and the repository: sizes, the README's set-up commands (the ones CI
runs), the options table, the generated tuning table, links, cited records, and no reference to a
file outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import vaeshard
from vaeshard import tuning

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if line and (ROOT / line).is_file()]


def test_readme_and_benchmarks_stay_short():
    assert len(README.encode()) <= 8192
    assert len((ROOT / "BENCHMARKS.md").read_bytes()) <= 16384


def test_readme_opens_with_title_pitch_and_the_two_commands_ci_runs():
    lines = README.splitlines()
    assert lines[0] == "# vaeshard"
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2 and block[0].endswith("&& vaeshard demo") and block[1].endswith("&& python3 -m pytest")
    first_code = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert all(not line.startswith("#") for line in lines[1:first_code])  # only the pitch before them
    assert block[1] in (ROOT / ".ci" / "run").read_text()


def test_readme_options_table_is_fast_options():
    table = README.split("<!-- fast-options:begin", 1)[1].split("<!-- fast-options:end", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| `([^`]+)` \|", table, re.M)}
    knobs = {name: repr(default).replace("'", '"') for name, default, *_ in vaeshard.FastOptions.knobs()}
    assert rows == knobs


def test_tuning_table_is_generated_from_tuning_py():
    assert (ROOT / "docs" / "tuning.md").read_text() == tuning.markdown(), (
        "run python -m vaeshard.tuning > docs/tuning.md"
    )


def test_every_threshold_has_an_entry_and_every_entry_a_value():
    constants = {n for n in vars(tuning) if n.isupper() and n != "TABLE"}
    named = {e.name for e in tuning.TABLE}
    assert constants <= named, constants - named
    for entry in tuning.TABLE:
        assert entry.decides and entry.measured, entry.name
        tuning._value(entry.name)  # exists


def test_nothing_points_outside_the_repository():
    pattern = re.compile(r"\.\./shared|DESIGN\.md|BENCHMARKING\.md")
    hits = [
        str(p.relative_to(ROOT))
        for p in _tracked()
        if not str(p.relative_to(ROOT)).startswith("benchmarks/results/")
        and p.suffix in (".md", ".py", ".sh", ".toml")
        and p.name != "test_docs.py"
        and pattern.search(p.read_text(errors="ignore"))
    ]
    assert not hits, hits


def test_relative_links_in_the_docs_exist():
    broken = []
    for doc in [
        ROOT / "README.md",
        ROOT / "BENCHMARKS.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "CHANGELOG.md",
        *sorted((ROOT / "docs").rglob("*.md")),
    ]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_cited_records_exist():
    missing = []
    for doc in (ROOT / "BENCHMARKS.md", ROOT / "README.md", ROOT / "docs" / "perf-log.md"):
        for cited in re.findall(r"`((?:benchmarks/results/)?20\d\d-\d\d-\d\d/[\w./-]+)`", doc.read_text()):
            path = cited if cited.startswith("benchmarks/") else f"benchmarks/results/{cited}"
            if not (ROOT / path).exists():
                missing.append(f"{doc.name}: {cited}")
    assert not missing, missing
