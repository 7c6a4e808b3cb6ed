#!/usr/bin/env bash
# dsv4-ops-bench on the H200 (issue 13's op timing table; docs/cuda-backend.md "Measuring the ops"). Run from the
# repository root on the GPU machine, with the bundle that bench/ops/bundle_h200.sh made (it copies this script
# into the bundle as run.sh):
#   bash .gpu/ops-bench/run.sh "$OUT"                 # smoke, then TP 1 and TP 4 tables (about 3 minutes;
#                                                     the step timeouts add up to 570 s, under the 600 s of a run call)
#   STEPS="smoke tp1" bash .gpu/ops-bench/run.sh "$OUT"
# Steps: smoke (smallest shape of every op once, graph captured, outputs checked), tp1 (the default sweep at the
# shapes of configs/flash.json), tp4 (one rank of TP 4: the families whose shapes change), full (every size of the
# issue, not timed yet: give it a call of its own), memcheck (compute-sanitizer on the smoke run, 16 experts held).
# Every step writes <step>.md (the tables), <step>.json and <step>.err under $OUT. BUNDLE names another bundle
# folder; ARGS adds flags to every run.
set -uo pipefail
OUT=${1:-${OUT:-out}}
mkdir -p "$OUT"
B=${BUNDLE:-.gpu/ops-bench}
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
BIN=$B/bin/dsv4-ops-bench
TAG="build $(cat "$B/COMMIT" 2>/dev/null || echo unknown)"
CONFIG=""
[ -f configs/flash.json ] && CONFIG=--config=configs/flash.json
STEPS=${STEPS:-"smoke tp1 tp4"}
ARGS=${ARGS:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
worst=0
run() {  # run STEP TIMEOUT FLAGS...
  local step=$1 limit=$2
  shift 2
  echo "=== $step ($(date +%T)): $BIN $* $ARGS"
  timeout "$limit" "$BIN" $CONFIG --tag="$TAG" --json="$OUT/$step.json" "$@" $ARGS > "$OUT/$step.md" 2> "$OUT/$step.err"
  local rc=$?
  echo "rc=$rc"
  [ $rc -gt $worst ] && worst=$rc
  cat "$OUT/$step.md"
  tail -8 "$OUT/$step.err"
}
for step in $STEPS; do
  case $step in
    smoke) run smoke 120 --smoke ;;
    tp1) run tp1 270 ;;
    tp4) run tp4 180 --tp=4 --only=linear,moe,attention,dense ;;
    full) run full 580 --full ;;
    memcheck)
      echo "=== memcheck ($(date +%T))"
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" $CONFIG --smoke --experts=16 \
        --json="$OUT/memcheck.json" $ARGS > "$OUT/memcheck.md" 2> "$OUT/memcheck.err"
      rc=$?; echo "rc=$rc"; [ $rc -gt $worst ] && worst=$rc
      grep -E "ERROR SUMMARY|cases," "$OUT/memcheck.md" "$OUT/memcheck.err" | tail -4 ;;
    *) echo "unknown step $step"; worst=2 ;;
  esac
done
exit $worst
