#!/usr/bin/env bash
# `tensorsmith bench` on the lent H200, in one device call: install the carried wheels (.whl, built once here by
# ../shared/tools/device-wheels.sh) and tensorsmith, run the bench's GPU tests, then the cases named; the JSON and
# Markdown of the run, and the log, go under $OUT. Join the JSON of several calls here with
#   tensorsmith bench --from-json part1.json part2.json -o BENCHMARKS.md
# Usage (through the device tool, carrying .whl):  bash benchmarks/bench_h200.sh NAME [--time-limit S] [CASE ...]
set -uo pipefail
OUT=${OUT:-/tmp/out}
NAME=${1:?name of this part, e.g. part1}; shift
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v -i "root\|already exists" | tail -3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>&1 | grep -v -i "root\|already exists" | tail -3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
    TENSORSMITH_CACHE_DIR=/tmp/ts-test-cache python3 -m pytest -p no:cacheprovider -m gpu -q -rfE $TESTS 2>&1 \
        | tee "$OUT/$NAME-tests.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -20
fi
python3 -m tensorsmith.cli bench --commit "${COMMIT:-unknown}" -o "$OUT/$NAME.md" "$@" 2>&1 | tee "$OUT/$NAME.log"
