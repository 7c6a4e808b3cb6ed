#!/usr/bin/env bash
# The multi-weight FP8/BF16 linear (issue 14 part 1: one launch for the projections that read the same x;
# kernels/cuda/linear_fused.cu) measured and checked on the H200 in ONE device call, written before any GPU had run
# it (docs/cuda-backend.md "Not yet measured: the multi-weight linear").
#
# 1. Here, on the build machine (builds build-h200 for sm_90a, strips, bundles, tars into /work/main/.gpu/):
#      bash bench/gemm/run_next.sh bundle
# 2. One device call (carry [".gpu/fp8-fuse.tar.xz"]; timeout_s 600), from the repository root there:
#      tar xJf .gpu/fp8-fuse.tar.xz -C .gpu && bash .gpu/fp8-fuse/run_next.sh run "$OUT"
#    the default steps (tests memcheck groups decode) fit the 10-minute call (their timeouts add to 590 s; expected
#    ~4-6 minutes); one tarball comes back: $OUT/fp8-fuse-logs.tgz (plus summary.txt). If device time is left, a
#    second call for the profile and the lean build on the single weights:
#      tar xJf .gpu/fp8-fuse.tar.xz -C .gpu && STEPS="ncu lean" bash .gpu/fp8-fuse/run_next.sh run "$OUT"
#
# Steps of `run` (STEPS to pick; each under `timeout`, so a hang costs its limit only):
#   tests     cuda_ops_test FusedLinear* (CPU reference at flash TP1/TP4 group shapes, T = 1..128, every build,
#             bits vs hardware dequant bit for bit, graph replay) + Dense* (the single linear, whose split-K epilogue
#             was generalised), cuda_model_test
#   memcheck  compute-sanitizer on the fused kernel's ragged edges, refusals and fallbacks
#   groups    dsv4-gemm-bench --singles=false: each group as separate linears vs one FusedLinear vs every build
#             (default / bits / lean / lean bits), against the group's byte floor
#   lean      dsv4-gemm-bench single shapes at T = 1..8 (the automatic kernel beside the plan variants)
#   decode    dsv4-decode-bench rank 0 of TP 4, 43 layers, context 8192, B = 1 and 64, without and with
#             --fuse_projections (the A/B of ModelOptions::fuse_projections on the whole step)
#   ncu       ncu of the fused kernel (default and lean) on the ratio-4 group at T = 1: DRAM throughput, warps per
#             SM, registers, issue slots, stall reasons
set -uo pipefail
MODE=${1:?usage: run_next.sh bundle | run OUT}
NAME=fp8-fuse

if [ "$MODE" = bundle ]; then
  set -e
  cd "$(git rev-parse --show-toplevel)"
  DEST=/work/main/.gpu/$NAME
  export PATH=/usr/local/cuda/bin:$PATH
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache} CCACHE_BASEDIR=$PWD
  cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
  cmake --build build-h200 -j2 --target dsv4-gemm-bench dsv4-decode-bench cuda_ops_test cuda_model_test
  rm -rf "$DEST" "$DEST.tar.xz"
  /work/shared/gpu/bundle.sh "$DEST" build-h200/bench/gemm/dsv4-gemm-bench build-h200/bench/decode/dsv4-decode-bench \
    build-h200/tests/cuda/cuda_ops_test build-h200/tests/cuda/cuda_model_test
  strip "$DEST"/bin/*
  cp bench/gemm/run_next.sh "$DEST/run_next.sh"
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!build*' || echo '+uncommitted')" > "$DEST/COMMIT"
  tar cJf "$DEST.tar.xz" -C /work/main/.gpu "$NAME"
  rm -rf "$DEST"
  ls -l "$DEST.tar.xz"
  echo "device call: carry [\".gpu/$NAME.tar.xz\"], command:"
  echo "  tar xJf .gpu/$NAME.tar.xz -C .gpu && bash .gpu/$NAME/run_next.sh run \"\$OUT\""
  exit 0
fi

[ "$MODE" = run ] || { echo "unknown mode $MODE"; exit 2; }
OUT=${2:-${OUT:-out}}
LOG="$OUT/$NAME"
mkdir -p "$LOG"
B=.gpu/$NAME
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} DSV4_SOURCE_DIR=$PWD NCCL_NVLS_ENABLE=0
STEPS=${STEPS:-"tests memcheck groups decode"}
TAG="build $(cat "$B/COMMIT" 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$LOG/gpu.txt" 2>&1
worst=0
note() { echo "=== $1 ($(date +%T)) rc=$2" | tee -a "$OUT/summary.txt"; [ "$2" -gt "$worst" ] && worst=$2; }
pack() { tar czf "$OUT/$NAME-logs.tgz" -C "$OUT" "$NAME"; }
DECODE="$B/bin/dsv4-decode-bench --config=configs/flash.json --simulate-rank=0 --simulate-world=4 --context=8192 \
  --batches=1,64 --comm-busbw-gbs=146 --comm-latency-us=20"
for step in $STEPS; do
  case $step in
    tests)
      timeout 150 "$B/bin/cuda_ops_test" --gtest_brief=1 --gtest_filter='FusedLinear*:DenseLinear*:DenseGraph*' \
        > "$LOG/tests.txt" 2>&1
      note "cuda_ops_test FusedLinear* DenseLinear* DenseGraph*" $?
      grep -E "^\[  (PASSED|FAILED)|tests? from .* ran|FAILED  \]" "$LOG/tests.txt" | tail -20 | tee -a "$OUT/summary.txt"
      timeout 90 "$B/bin/cuda_model_test" --gtest_brief=1 > "$LOG/model.txt" 2>&1
      note "cuda_model_test" $?
      grep -E "^\[  (PASSED|FAILED)|ran\.|FAILED  \]" "$LOG/model.txt" | tail -6 | tee -a "$OUT/summary.txt" ;;
    memcheck)
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/bin/cuda_ops_test" --gtest_brief=1 \
        --gtest_filter='FusedLinear.ForcedPlansAtEdges:FusedLinear.BadArgumentsAndPlansAreRefused:FusedLinear.FallbacksAndZeroTokens:FusedLinear.SingleGroupedLinearThroughTheKernel' \
        > "$LOG/memcheck.txt" 2>&1
      note "memcheck (fused kernel edges)" $?
      grep -E "ERROR SUMMARY|PASSED|FAILED" "$LOG/memcheck.txt" | tail -4 | tee -a "$OUT/summary.txt" ;;
    groups)
      timeout 90 "$B/bin/dsv4-gemm-bench" --config=configs/flash.json --singles=false --peers=false --reps=30 \
        --warmup_ms=2 --json="$LOG/groups.json" --tag="$TAG" > "$LOG/groups.md" 2> "$LOG/groups.err"
      note "dsv4-gemm-bench groups" $?
      grep -E "^### group|^\| (1|8|32|128) \|" "$LOG/groups.md" | tee -a "$OUT/summary.txt" ;;
    lean)
      timeout 100 "$B/bin/dsv4-gemm-bench" --config=configs/flash.json --groups=false --peers=false --tp=1 \
        --tokens=1,8 --reps=20 --warmup_ms=2 --json="$LOG/singles.json" --tag="$TAG" > "$LOG/singles.md" \
        2> "$LOG/singles.err"
      note "dsv4-gemm-bench singles T=1,8" $? ;;
    decode)
      for fuse in false true; do
        timeout 70 $DECODE --fuse_projections=$fuse --json="$LOG/decode_fuse_$fuse.json" > "$LOG/decode_fuse_$fuse.txt" 2>&1
        note "dsv4-decode-bench TP4 rank 0 fuse_projections=$fuse" $?
        grep -E "^\| *(1|64) \|" "$LOG/decode_fuse_$fuse.txt" | head -4 | tee -a "$OUT/summary.txt"
      done ;;
    ncu)
      # The ratio-4 group at T = 1, no weight rotation (ncu flushes the caches between passes): per column an eager
      # launch, 3 warm-up and 3 timed replays; 40 launches cover the ops default and the four builds.
      timeout 200 ncu --clock-control none --set full -k regex:LinearFusedKernel -c 40 -o "$LOG/fused_ncu" \
        "$B/bin/dsv4-gemm-bench" --config=configs/flash.json --tp=1 --only=ratio-4 --singles=false --peers=false \
        --tokens=1 --reps=3 --warmup_ms=0 --rotate_mb=1 --json= > "$LOG/ncu_run.txt" 2>&1
      note "ncu LinearFusedKernel" $?
      timeout 60 ncu --import "$LOG/fused_ncu.ncu-rep" --page details --csv > "$LOG/fused_ncu.csv" 2>&1
      timeout 60 ncu --import "$LOG/fused_ncu.ncu-rep" --page details > "$LOG/fused_ncu.txt" 2>&1
      grep -E "Duration|DRAM Throughput|Registers Per Thread|Achieved Active Warps|Issue Slots Busy" \
        "$LOG/fused_ncu.txt" | head -24 | tee -a "$OUT/summary.txt" ;;
    *) echo "unknown step $step"; worst=2 ;;
  esac
  pack
done
exit $worst
