#!/usr/bin/env bash
# GPU session 4: every GPU test (real kernels, larger shapes), then the forward grid and decode.
set -uo pipefail
export PYTHONUNBUFFERED=1
timeout 260 python3 -m pytest -q -x -k "not compiles" tests/kernels tests/test_api.py tests/test_arrays.py tests/bench 2>&1 | tee $OUT/tests.log | tail -8
timeout 200 python3 bench/bench_attention.py --mode fwd --providers nf-tc,nf-simt,sdpa-flash,sdpa-cudnn,triton --out-dir $OUT > $OUT/bench.log 2>&1; tail -52 $OUT/bench.log
timeout 100 python3 bench/bench_mla.py --heads-q 1,16,128 --seqlens 4096,16384,32768 --out-dir $OUT >> $OUT/bench.log 2>&1; tail -42 $OUT/bench.log
ls $OUT
