#!/usr/bin/env bash
# GPU session 3: tensor-core forward correctness (real mma.sync vs emulation), tile sweep.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pytest -q -k "not compiles" tests/kernels/tc tests/kernels/simt/test_forward.py tests/test_api.py tests/test_arrays.py 2>&1 | tee $OUT/tests.log | tail -15
python3 bench/tune_tc_forward.py --out-dir $OUT 2>&1 | tee $OUT/tune.log | tail -50
