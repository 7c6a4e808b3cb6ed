#!/usr/bin/env bash
# Runs every libFuzzer target of a DSV4_FUZZ=ON build for a bounded time and fails on the first crash, leak,
# timeout or out-of-memory. Each target starts from a scratch copy of its committed corpus (fuzz/corpus/<target>:
# seeds + regression inputs), so the repository is never modified; new crash inputs are kept under
# $FUZZ_OUT/<target>/ (crash-*, leak-*, timeout-*, oom-*) for reproduction:  build-asan/fuzz/<target> <file>
#
#   scripts/fuzz.sh                          # 30 s per target, build-asan, two targets at a time
#   FUZZ_SECONDS=600 scripts/fuzz.sh config_fuzzer
#
# Prints one line per target: runs, executions per second, corpus growth, coverage, and the result.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_JOBS=${FUZZ_JOBS:-2}
FUZZ_OUT=${FUZZ_OUT:-$BUILD_DIR/fuzz-out}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(safetensors_fuzzer checkpoint_index_fuzzer config_fuzzer quant_config_fuzzer request_fuzzer
           step_plan_fuzzer)
fi
# Leaks count as findings; ASan/UBSan reports abort the run (libFuzzer then writes the input).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_one() {
  local t=$1 bin=$BUILD_DIR/fuzz/$1 work=$FUZZ_OUT/$1
  rm -rf "$work" && mkdir -p "$work/corpus"
  cp fuzz/corpus/"$t"/* "$work/corpus/"
  local before
  before=$(ls "$work/corpus" | wc -l)
  # -timeout: one input taking over 10 s is a finding (a parser that hangs on hostile input).
  # -rss_limit_mb: 2 GiB, libFuzzer's default, stated so that the bound is visible here.
  local rc=0 dict=()
  [ -f fuzz/dict/"$t".dict ] && dict=(-dict=fuzz/dict/"$t".dict)
  "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$work/" "$work/corpus" >"$work/log" 2>&1 || rc=$?
  local runs eps cov after
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1 | cut -d' ' -f2)
  after=$(ls "$work/corpus" | wc -l)
  if [ "$rc" -eq 0 ]; then
    printf 'fuzz: %-24s ok     %8s runs %6s exec/s  cov %5s  corpus %s -> %s (%ss)\n' \
      "$t" "${runs:-?}" "${eps:-?}" "${cov:-?}" "$before" "$after" "$FUZZ_SECONDS"
  else
    printf 'fuzz: %-24s FAILED (exit %s); input and log in %s\n' "$t" "$rc" "$work"
    grep -E 'ERROR|FUZZ_CHECK|runtime error|Test unit written' "$work/log" | head -20 | sed 's/^/fuzz:   /'
    return 1
  fi
}

fail=0
pids=()
names=()
for t in "${targets[@]}"; do
  if [ ! -x "$BUILD_DIR/fuzz/$t" ]; then
    echo "fuzz: $BUILD_DIR/fuzz/$t is not built (configure with -DDSV4_FUZZ=ON, see scripts/sanitize.sh)" >&2
    exit 2
  fi
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  if [ ${#pids[@]} -ge "$FUZZ_JOBS" ]; then
    wait "${pids[0]}" || fail=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [ "$fail" -ne 0 ]; then
  echo "fuzz: a target found a crash (see above); add the input to fuzz/corpus/<target>/regress-* with the fix"
  exit 1
fi
