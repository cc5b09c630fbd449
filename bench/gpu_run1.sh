#!/usr/bin/env bash
# One batched GPU session: probes, GPU test run, benchmarks. Logs and CSVs go under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt
python3 -c "import cupy, ml_dtypes; a = cupy.empty(3, dtype=ml_dtypes.bfloat16); print('cupy bf16 ok', a.dtype)" 2>&1 | tail -1 | tee -a $OUT/gpu.txt
python3 -m pytest -q -x tests/kernels/simt/test_forward.py tests/test_api.py tests/test_arrays.py 2>&1 | tee $OUT/tests.log | tail -15
python3 bench/bench_attention.py --dtypes float16 --providers nf-simt,sdpa-flash,sdpa-cudnn --out-dir $OUT 2>&1 | tee $OUT/bench.log | tail -30
