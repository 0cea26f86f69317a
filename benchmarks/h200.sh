#!/usr/bin/env bash
# One call on the lent H200: install the carried wheels and tensorsmith, run the GPU tests, compile and check
# every example, then the benchmarks; logs go under $OUT, short tables print last.
# From the project root here:  ../shared/tools/device-wheels.sh   (once; builds .whl/)
# Then through the device tool, carrying .whl:  bash benchmarks/h200.sh [tests|examples|memory|matmul|attention ...]
# (no argument: all of them; about 12 minutes, so split it over two calls; BUDGET=15 shortens each example's search,
# ONLY=gelu,softmax picks memory-bound rows; `sass` prints where the device's ptxas puts the wgmma waits, with
# nvidia-cuda-nvdisasm's wheel downloaded into .whl; `fuzz` runs benchmarks/fuzz.py over FUZZ_GRAPHS graphs (10000)
# from seed 0 on the machine's CPUs, FUZZ_SHARDS (12) processes in the background while the steps after it run;
# `wait` waits for them, until DEADLINE (570) seconds into the script, and prints their last counts; `launch` prints
# what one more kernel costs a replayed graph, with ordinary and with programmatic launches; `decode` runs
# benchmarks/decode.py at LAYERS (16) layers, Llama-3.2-1B's shape, about 5 minutes with its compile. The Mixtral
# row is a bench case: bench_h200.sh mixtral mixtral_p512_fp16 --baselines eager,compile --no-backend)
set -uo pipefail
OUT=${OUT:-/tmp/out}
STEPS=${*:-tests examples memory matmul attention}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v -i "root\|already exists" | tail -3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>&1 | grep -v -i "root\|already exists" | tail -3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TENSORSMITH_CACHE_DIR=/tmp/ts-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
for step in $STEPS; do case $step in
tests) TS_AGREEMENT_LOG=$OUT/agreement.tsv python3 -m pytest -p no:cacheprovider -m gpu -q -rfE -n 4 tests 2>&1 \
        | tee $OUT/pytest-gpu.log | tail -12 ;;
fuzz) shards=${FUZZ_SHARDS:-12}; graphs=${FUZZ_GRAPHS:-10000}; per=$(( (graphs + shards - 1) / shards ))
    for i in $(seq 0 $((shards - 1))); do
        CUDA_VISIBLE_DEVICES= python3 benchmarks/fuzz.py --graphs $per --seed $((i * per)) --every 50 \
            > /tmp/fuzz-$i.log 2>&1 &
    done ;;
wait) while [ -n "$(jobs -rp)" ] && [ $SECONDS -lt ${DEADLINE:-570} ]; do sleep 5; done   # the call's 600 s
    for log in /tmp/fuzz-*.log; do echo "== $log"; cat "$log"; done > $OUT/fuzz.log   # (few files come back)
    for log in /tmp/fuzz-*.log; do tail -n 1 "$log"; done | tee $OUT/fuzz-summary.txt ;;
examples) for model in examples/*.py; do
        name=$(basename "$model" .py)
        python3 -m tensorsmith.cli compile --target sm90 "$model" -o "$OUT/$name" -q --budget "${BUDGET:-60}" \
            || echo "compile $name FAILED"
        python3 -m tensorsmith.cli run "$OUT/$name" --check --device cuda | tail -1
    done 2>&1 | tee $OUT/examples.log ;;
memory) python3 benchmarks/memory_bound.py ${ONLY:+--only $ONLY} 2>&1 | tee $OUT/memory_bound.log | tail -8 ;;
matmul) (cd benchmarks && python3 matmul.py --sweep --wgmma \
            && python3 matmul.py --sweep --defaults --dtype bfloat16) 2>&1 | tee $OUT/matmul.log | grep -E "^ *[0-9]+ x|default|WRONG|float16" ;;
sass) python3 benchmarks/sass.py 2>&1 | tee $OUT/sass.log ;;   # needs the nvidia-cuda-nvdisasm wheel in .whl
attention) (cd benchmarks && python3 attention.py --sweep) 2>&1 | tee $OUT/attention.log | tail -30 ;;
launch) python3 -c "from tensorsmith.codegen.launch_cost import measured_launch_seconds as m; print('one more kernel:'
        ' %.2f us ordinary, %.2f us programmatic' % (m(False) * 1e6, m(True) * 1e6))" | tee $OUT/launch.txt ;;
decode) python3 benchmarks/decode.py --layers "${LAYERS:-16}" --kernels 12 2>&1 | tee $OUT/decode.log | tail -40 ;;
esac; done
