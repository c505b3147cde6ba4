"""benchmarks/results/ holds only the records the documents cite, each citation names a record that
exists, and the folder stays small. A citation is a path under benchmarks/results/ (written with that
prefix or from its date on); one that names a folder cites every file in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MAX_FILES = 150  # a record worth keeping is cited; history lives in git (docs/perf-log.md says how)

# a date folder and what follows it, up to the first character that is not part of a path
_CITATION = re.compile(r"(?:benchmarks/results/)?(20\d\d-\d\d-\d\d/[\w./-]*[\w/])")


def _citing() -> list[Path]:
    docs = [ROOT / name for name in ("BENCHMARKS.md", "README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    return [*docs, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "src" / "vaeshard" / "tuning.py"]


def citations(text: str) -> set[str]:
    return {m.rstrip("/") for m in _CITATION.findall(text)}


def _cited() -> dict[str, str]:
    return {c: doc.name for doc in _citing() if doc.exists() for c in citations(doc.read_text())}


def _records() -> list[str]:
    return sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file())


def test_citations_are_found_as_written():
    text = (
        "`2026-12-01/head/call411/` and (benchmarks/results/2026-12-02/first-request/). "
        "`2026-12-01/restructure-ab/parity-B.jsonl`, 2026-12-01 phases (not a path), 2026-12-02"
    )
    assert citations(text) == {
        "2026-12-01/head/call411",
        "2026-12-02/first-request",
        "2026-12-01/restructure-ab/parity-B.jsonl",
    }


def test_every_citation_exists():
    missing = [f"{doc}: {c}" for c, doc in sorted(_cited().items()) if not (RESULTS / c).exists()]
    assert not missing, missing


def test_every_record_is_cited_and_they_are_few():
    cited = _cited()
    records = _records()
    uncited = [f for f in records if not any(f == c or f.startswith(c + "/") for c in cited)]
    assert not uncited, f"cite these in BENCHMARKS.md, docs/ or tuning.py, or remove them: {uncited}"
    assert len(records) <= MAX_FILES, f"{len(records)} files under benchmarks/results/: keep at most {MAX_FILES}"


def test_every_benchmark_script_named_exists():
    # a script renamed or folded into another leaves no reference behind (the records' own command
    # lines under benchmarks/results/ keep the names they ran with)
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    missing = []
    for rel in listed.splitlines():
        path = ROOT / rel
        if rel.startswith("benchmarks/results/") or path.suffix not in (".md", ".py", ".sh", ".toml"):
            continue
        if not path.is_file():
            continue
        for name in re.findall(r"benchmarks/(\w+\.(?:py|sh))", path.read_text(errors="ignore")):
            if name != "NAME.py" and not (ROOT / "benchmarks" / name).is_file():
                missing.append(f"{rel}: benchmarks/{name}")
    assert not missing, missing
