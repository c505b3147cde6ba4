#!/usr/bin/env bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
timeout 200 python3 .ab/launch_parts.py > $OUT/launch_parts.log 2>&1; echo "rc=$?"; cat $OUT/launch_parts.log | tail -20
