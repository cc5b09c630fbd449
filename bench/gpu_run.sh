#!/usr/bin/env bash
# The GPU test run and the benchmarks in one call on a GPU machine, each stage under its own time
# limit, logs in $OUT/log.txt and CSV/PNG files in $OUT/<stage>/ (default OUT:
# $TMPDIR/numba_flash-gpu-run; what the READMEs quote is copied into bench/results/<gpu>/). The
# CSVs are rewritten after every measured point, so a stage cut short by its limit still leaves
# what it measured.
#
#   bench/gpu_run.sh tests fwd bwd mla io            # stages, in the order given
#   LIMIT_BWD=300 bench/gpu_run.sh bwd               # a longer limit for one stage
#
# Stages: tests (the quick selection, -m "not slow": every test function once; TESTS=paths
# narrows it, PYTEST_ARGS adds pytest flags), tests-rest (the other cases, -m slow: with tests, the whole suite, which does not
# fit one 10-minute command on an H200),
# fwd / bwd (the attention grid of docs/design.md; FWD_ARGS adds bench_attention.py flags to fwd),
# mla (decode grid; FLASHMLA_DIR adds FlashMLA, MLA_ARGS adds bench_mla.py flags), host (a decode call's host vs GPU time), io (HBM bytes under ncu),
# sweep (tc tiles), sanitize (bench/every_kernel.py under compute-sanitizer's four tools, both tc
# families; TOOLS and FAMILIES narrow it),
# profile-tc / profile-mla (ncu sections of the tc forward / the decode kernel).
set -uo pipefail
declare -A pids
export PYTHONUNBUFFERED=1
OUT=${OUT:-${TMPDIR:-/tmp}/numba_flash-gpu-run}
mkdir -p "$OUT"
L=$OUT/log.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

run() {  # run STAGE LIMIT_SECONDS COMMAND...
  local stage=$1 limit=$2; shift 2
  echo "=== $stage (limit ${limit}s, $(date +%T))" | tee -a "$L"
  timeout "$limit" "$@" >> "$L" 2>&1
  echo "=== $stage: exit $?" | tee -a "$L"
}

for stage in "$@"; do
  case $stage in
    tests) run tests "${LIMIT_TESTS:-300}" python3 -m pytest -q -p no:cacheprovider -rfE \
             -n "${WORKERS:-16}" -m "not slow" --durations=30 ${PYTEST_ARGS:-} ${TESTS:-tests} ;;
    tests-rest) run tests-rest "${LIMIT_TESTS_REST:-570}" python3 -m pytest -q \
             -p no:cacheprovider -rfE -n "${WORKERS:-16}" -m slow --durations=30 ${PYTEST_ARGS:-} \
             ${TESTS:-tests} ;;
    fwd) run fwd "${LIMIT_FWD:-240}" python3 bench/bench_attention.py --mode fwd \
           --out-dir "$OUT/fwd" ${FWD_ARGS:-} ;;
    bwd) run bwd "${LIMIT_BWD:-300}" python3 bench/bench_attention.py --mode bwd \
           --dtypes float16,bfloat16 --providers nf-tc,sdpa-flash,sdpa-cudnn,triton \
           --out-dir "$OUT/bwd" ;;
    mla) run mla "${LIMIT_MLA:-330}" python3 bench/bench_mla.py ${MLA_ARGS:-} \
           --out-dir "$OUT/mla" ;;
    host) run host "${LIMIT_HOST:-120}" python3 bench/host_overhead.py --profile \
            --out-dir "$OUT/host" ;;
    io) run io "${LIMIT_IO:-120}" python3 bench/io_bytes.py --ncu "$NCU" --out-dir "$OUT/io" ;;
    sweep) run sweep "${LIMIT_SWEEP:-240}" python3 bench/tune_tc_forward.py --out-dir "$OUT/sweep" ;;
    profile-tc)
      # The third launch of the tc forward is the first timed one (a probe and the reference
      # check come first).
      for d in 64 128; do
        run "profile tc D=$d" "${LIMIT_PROFILE:-90}" "$NCU" --clock-control none \
          -k 'regex:flash_fwd_(tc|wgmma)' --launch-skip 2 --launch-count 1 --section SpeedOfLight \
          --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
          --section InstructionStats --section MemoryWorkloadAnalysis_Tables --section LaunchStats \
          python3 bench/bench_attention.py --providers nf-tc --dtypes float16 --head-dims $d \
          --seqlens 4096 --causal 0 --no-plot --out-dir /tmp/profile_$d
      done ;;
    sanitize)  # every kernel under each compute-sanitizer tool, the four tools side by side,
      # for the device's own tc family and for mma.sync (planned as for an A100; each process
      # compiles every kernel: CPU-bound); a tool's errors fail its line (racecheck's on the
      # seesaw decode too: docs/design.md, "The seesaw under racecheck", reads them as accesses
      # a barrier orders; tools/racecheck_pairs.py places each pair in the SASS); the last lines
      # show whether it still misreads tools/racecheck_arrive.py, a correct kernel with the
      # same hand-off
      SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
      echo "=== sanitize (limit ${LIMIT_SANITIZE:-420}s, $(date +%T))" | tee -a "$L"
      for family in ${FAMILIES:-default mma}; do
        for tool in ${TOOLS:-memcheck racecheck synccheck initcheck}; do
          timeout "${LIMIT_SANITIZE:-420}" "$SAN" --tool "$tool" --report-api-errors no \
            --print-limit 1000 --error-exitcode 1 python3 bench/every_kernel.py \
            --family "$family" > "$OUT/sanitize-$tool-$family.txt" 2>&1 &
          pids[$tool-$family]=$!
        done
      done
      for family in ${FAMILIES:-default mma}; do
        for tool in ${TOOLS:-memcheck racecheck synccheck initcheck}; do
          wait "${pids[$tool-$family]}"
          echo "=== sanitize $tool ($family): exit $? ($(tail -1 "$OUT/sanitize-$tool-$family.txt"))" \
            | tee -a "$L"
        done
      done
      for family in ${FAMILIES:-default mma}; do  # each reported pair placed among the kernel's
        # barriers, in the seesaw specializations every_kernel.py runs (d 192 / 64, page 64,
        # one query row, and 16 rows causal)
        python3 tools/racecheck_pairs.py "$OUT/sanitize-racecheck-$family.txt" \
          --spec tc.mla_decode_seesaw '[1, 192, 64, false, "bfloat16", true, true]' \
          --spec tc.mla_decode_seesaw '[16, 192, 64, true, "bfloat16", true, true]' \
          > "$OUT/racecheck-pairs-$family.txt" 2>&1
        echo "=== racecheck pairs ($family): $(head -1 "$OUT/racecheck-pairs-$family.txt")" \
          | tee -a "$L"
      done
      for part in both both-named; do
        "$SAN" --tool racecheck python3 tools/racecheck_arrive.py $part \
          > "$OUT/racecheck-arrive-$part.txt" 2>&1
        echo "=== racecheck on tools/racecheck_arrive.py $part (correct; 0 hazards once" \
          "racecheck reads the hand-off right): $(grep -h "$part:" "$OUT/racecheck-arrive-$part.txt")," \
          "$(tail -1 "$OUT/racecheck-arrive-$part.txt")" | tee -a "$L"
      done ;;
    profile-mla)  # MLA_PROVIDER (nf-simt, nf-tc) at h_q = MLA_HEADS; launches 7+ are timed ones
      run "profile decode" "${LIMIT_PROFILE:-90}" "$NCU" --clock-control none \
        -k regex:mla_decode --launch-skip 6 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section InstructionStats --print-details all \
        python3 bench/bench_mla.py --providers "${MLA_PROVIDER:-nf-simt}" --s-q 1 \
        --heads-q "${MLA_HEADS:-1}" --seqlens 4096 --no-plot --out-dir /tmp/profile_mla ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
