#!/usr/bin/env bash
# GPU session 5 (last of the day): GPU tests of the changed kernels, the backward grid, decode
# tests at DeepSeek sizes, Nsight Compute profiles of the gaps, the tile sweep and the IO plot.
# Every step has its own time limit; all logs go to $OUT/log.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { echo "=== $1 ($(date +%T))" | tee -a $L; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

step "tests: backward, forward (simt, tc), torch adapter, Triton references"
timeout 110 python3 -m pytest -q -p no:cacheprovider -rfE -k "not compiles" \
  tests/kernels/simt/test_backward.py tests/test_torch.py tests/kernels/tc/test_forward.py \
  tests/kernels/simt/test_forward.py tests/bench >> $L 2>&1; tail -3 $L

step "backward grid, N 1k/4k"
timeout 55 python3 bench/bench_attention.py --mode bwd --dtypes float16 --seqlens 1024,4096 \
  --providers nf-simt,sdpa-flash,sdpa-cudnn,triton --no-plot --out-dir $OUT/bwd_a >> $L 2>&1; tail -26 $L
step "backward grid, N 16k"
timeout 55 python3 bench/bench_attention.py --mode bwd --dtypes float16 --seqlens 16384 \
  --providers nf-simt,sdpa-flash,sdpa-cudnn,triton --no-plot --out-dir $OUT/bwd_b >> $L 2>&1; tail -18 $L

step "decode tests at DeepSeek sizes"
timeout 55 python3 -m pytest -q -p no:cacheprovider -rfE -k "not compiles" \
  tests/kernels/simt/test_mla_decode.py tests/kernels/simt/test_combine.py >> $L 2>&1; tail -3 $L

step "ncu: tc forward D=64 and D=128, decode h_q=1"
for d in 64 128; do
  timeout 18 $NCU --clock-control none -k regex:flash_fwd_tc --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    python3 bench/bench_attention.py --providers nf-tc --dtypes float16 --head-dims $d \
    --seqlens 4096 --causal 0 --no-plot --out-dir /tmp/ncu_$d >> $OUT/ncu.txt 2>&1
done
timeout 18 $NCU --clock-control none -k regex:mla_decode --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  python3 bench/bench_mla.py --providers nf-simt --s-q 1 --heads-q 1 --seqlens 4096 --no-plot \
  --out-dir /tmp/ncu_mla >> $OUT/ncu.txt 2>&1
grep -E "Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Duration" $OUT/ncu.txt | head -24

step "tc tile sweep"
timeout 40 python3 bench/tune_tc_forward.py --head-dims 64,128 --out-dir $OUT >> $L 2>&1; tail -18 $L

step "IO bytes (ncu)"
timeout 45 python3 bench/io_bytes.py --ncu "$NCU" --out-dir $OUT >> $L 2>&1; tail -8 $L
ls -R $OUT
