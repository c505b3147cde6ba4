#!/usr/bin/env python3
"""BENCHMARKS.md's figure: `vaeshard bench --plot`'s latency and per-rank memory drawing, from the
record of the current 2-GPU Wan 2.1 720p figures (its `--json`), with the command line's own code.

    python3 docs/figures/bench.py [OUT_DIR]      # default: docs/figures
"""

from __future__ import annotations

import sys
from pathlib import Path

from vaeshard.cli import report

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "benchmarks" / "results" / "2026-12-01" / "headline-tma" / "scaling_wan21-720p.json"


def main(out_dir: Path) -> Path:
    out = out_dir / "bench-wan21-720p.png"
    report.plot(report.read_json(str(RECORD)), str(out))
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent))
