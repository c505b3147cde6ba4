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


# `pip install` naming vaeshard as a package of an index: none is published, and the name is anyone's to
# register, so every instruction installs from a checkout (-e ., a path) or a git URL
_PIP_INSTALL = re.compile(r"pip3?\s+install\s+([^\n`&|;#]*)")  # to the end of the shell command
_PACKAGE = re.compile(r"vaeshard(\[[^\]]*\])?([<>=!~].*)?")


def _index_installs(text: str) -> list[str]:
    found = []
    for m in _PIP_INSTALL.finditer(text):
        if "git+" in m.group(1):
            continue
        names = [token.strip("'\"`),:") for token in m.group(1).split()]
        found += [f"pip install {name}" for name in names if _PACKAGE.fullmatch(name)]
    return found


def test_the_install_rule_tells_an_index_install_from_a_checkout_or_git_one():
    for bad in ("pip install vaeshard", "pip install 'vaeshard[serve]'", 'x: pip install "vaeshard[metrics]")',
                "python3 -m pip install -U vaeshard==0.2.0", "pip3 install torch vaeshard[plot]"):  # fmt: skip
        assert _index_installs(bad), bad
    for good in ('pip install -e ".[serve]"', "pip install -e .", "pip install matplotlib",
                 'pip install "vaeshard[serve] @ git+URL"', 'python3 -m pip install "torch==2.13.0" -e .'):  # fmt: skip
        assert not _index_installs(good), good


def test_no_instruction_installs_vaeshard_from_a_package_index():
    hits = {}
    for path in _tracked():
        rel = str(path.relative_to(ROOT))
        if rel.startswith("benchmarks/results/") or path.name == "test_docs.py":
            continue
        if path.suffix in (".md", ".py", ".sh", ".toml", ".txt", ".cfg") or path.parent.name == ".ci":
            if found := _index_installs(path.read_text(errors="ignore")):
                hits[rel] = found
    assert not hits, hits


def test_the_figures_are_drawn_by_their_scripts(tmp_path):
    # each committed picture comes from its script in docs/figures, which still runs (into tmp_path)
    import importlib.util

    from PIL import Image

    figures = ROOT / "docs" / "figures"
    for script, picture in (
        ("strategies.py", "strategies.png"),
        ("bench.py", "bench-wan21-720p.png"),
        ("comm.py", "comm-model.png"),
    ):
        spec = importlib.util.spec_from_file_location(f"figure_{Path(script).stem}", figures / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main(tmp_path) == tmp_path / picture
        with Image.open(tmp_path / picture) as drawn, Image.open(figures / picture) as committed:
            assert drawn.format == committed.format == "PNG" and drawn.size == committed.size, picture
        assert (figures / picture).stat().st_size < 150_000, picture  # small enough to commit


def test_the_family_guide_quotes_kandinskys_plan_as_it_is():
    """docs/adding-a-family.md shows Kandinsky 6's shard plan: every line of it stands in the family."""
    guide = (ROOT / "docs" / "adding-a-family.md").read_text()
    block = guide.split("SHARD_PLAN = ShardPlan(", 1)[1].split("```", 1)[0]
    source = (ROOT / "src" / "vaeshard" / "families" / "kandinsky6_sr.py").read_text()
    missing = [line for line in block.splitlines() if line.strip() and line not in source]
    assert not missing, missing


def test_the_multi_node_guide_says_the_groups_ports_take_no_key():
    """docs/serving.md's multi-node section says what the API key does not guard (torch.distributed's
    ports) and that they stay on a private network; its example keeps the key out of the process list."""
    serving = (ROOT / "docs" / "serving.md").read_text()
    section = serving.split("**One group over several machines**", 1)[1].split("\n## ", 1)[0]
    assert "torch.distributed's ports" in section and "take no key" in section and "private network" in section
    assert "--api-key " not in section.split("```bash", 1)[1].split("```", 1)[0]
