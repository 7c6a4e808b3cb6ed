#!/usr/bin/env bash
# The linear's tests and dsv4-gemm-bench on the H200, in one device call (issue 14). Bundle first, on the build
# machine: bash bench/gemm/bundle_h200.sh (build-h200, sm_90a -> /work/main/.gpu/fast-gemm). On the GPU machine,
# from the repository root:
#   bash .gpu/fast-gemm/run.sh "$OUT"                    # tests, memcheck, bench (about 3 minutes)
#   STEPS="bench" ARGS="--only=wq_b --tokens=1,32" bash .gpu/fast-gemm/run.sh "$OUT"
# Steps: tests (cuda_ops_test Dense* + the MoE cases that run the shared expert's linears, cuda_model_test),
# memcheck (compute-sanitizer on the odd shapes, the weight ring at its edges and the refused plans), bench
# (dsv4-gemm-bench, TP 1 and TP 4, peers, variants). Each step writes <step>.txt under $OUT; the bench also gemm.md and gemm.json.
set -uo pipefail
OUT=${1:-${OUT:-out}}
mkdir -p "$OUT"
B=${BUNDLE:-.gpu/fast-gemm}
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} DSV4_SOURCE_DIR=$PWD NCCL_NVLS_ENABLE=0
STEPS=${STEPS:-"tests memcheck bench"}
ARGS=${ARGS:-}
TAG="build $(cat "$B/COMMIT" 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
worst=0
note() { echo "=== $1 ($(date +%T)) rc=$2"; [ "$2" -gt "$worst" ] && worst=$2; }
for step in $STEPS; do
  case $step in
    tests)
      timeout 150 "$B/bin/cuda_ops_test" --gtest_brief=1 \
        --gtest_filter='Dense*:MoeGpu.TinyNvfp4:MoeGpu.SmallNvfp4ManyTokensPerExpert:MoeGpu.GraphReplayServesAnyRouting' \
        > "$OUT/tests.txt" 2>&1
      note "cuda_ops_test" $?
      grep -E "^\[  (PASSED|FAILED)|tests? from .* ran|FAILED  \]" "$OUT/tests.txt" | tail -20
      timeout 90 "$B/bin/cuda_model_test" --gtest_brief=1 > "$OUT/model.txt" 2>&1
      note "cuda_model_test" $?
      grep -E "^\[  (PASSED|FAILED)|ran\.|FAILED  \]" "$OUT/model.txt" | tail -6 ;;
    memcheck)
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/bin/cuda_ops_test" --gtest_brief=1 \
        --gtest_filter='DenseLinear.Fp8OddShapesAndStrides:DenseLinear.RingPlansAtEdges:DenseLinear.BadPlansAreRefused' \
        > "$OUT/memcheck.txt" 2>&1
      note "memcheck" $?
      grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.txt" | tail -4 ;;
    bench)
      timeout "${BENCH_TIMEOUT:-170}" "$B/bin/dsv4-gemm-bench" --config=configs/flash.json --json="$OUT/gemm.json" \
        --tag="$TAG" $ARGS > "$OUT/gemm.md" 2> "$OUT/gemm.err"
      note "dsv4-gemm-bench" $?
      tail -3 "$OUT/gemm.md"; tail -3 "$OUT/gemm.err" ;;
    *) echo "unknown step $step"; worst=2 ;;
  esac
done
exit $worst
