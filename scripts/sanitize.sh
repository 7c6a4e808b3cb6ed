#!/usr/bin/env bash
# The sanitizer and fuzzing stages of CI (scripts/test.sh runs them after the main build and ctest). Each stage has
# its own build folder, built with clang and CUDA off, and builds only the targets its tests need; why these tests
# and not others is written in docs/security.md "Fuzzing and sanitizers".
#
#   scripts/sanitize.sh              # asan, fuzz, tsan
#   scripts/sanitize.sh tsan         # one stage
#
#   asan  build-asan: AddressSanitizer + UndefinedBehaviorSanitizer (+ libFuzzer coverage, so the fuzz targets
#         share the libraries): the CPU unit and integration tests listed below, and every fuzz target's corpus.
#   fuzz  build-asan: every fuzz target for FUZZ_SECONDS (default 30), two at a time (scripts/fuzz.sh).
#   tsan  build-tsan: ThreadSanitizer on the worker, coordinator and comm tests listed below, with abseil's
#         Mutex/CondVar and gRPC's completion queues annotated for TSan (tests/sanitizers/tsan_*_sync.cc) and
#         tests/sanitizers/tsan.supp.
#   Each build folder also runs sanitizer_canary_* tests: a deliberate defect its sanitizer must report.
#
# Any sanitizer report fails the test that triggered it (halt_on_error / abort), so it fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(asan fuzz tsan)
JOBS=${JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
root=$(pwd)

# -O1 keeps the sanitized tests fast enough and the compile short; line tables give symbolized reports.
configure() {  # folder, extra cmake args...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DDSV4_ENABLE_CUDA=OFF "$@" >/dev/null
}

# ---- test selection (docs/security.md "Fuzzing and sanitizers" says why) ----
# ASan+UBSan: the CPU unit and integration tests, including real dsv4-worker processes on the tiny checkpoint
# (worker_test builds dsv4-worker, dsv4-make-checkpoint and dsv4-generate) and the coordinator against fake and
# real workers. Not: the model's golden/consistency suites and tensor-parallel model comparisons (minutes each
# under ASan; their targets are not built), and the Python/Prometheus end-to-end checks of deploy/.
ASAN_TARGETS=(checkpoint_test config_test worker_test coordinator_test dsv4-coordinator comm_test comm_peer
              metrics_test sparse_mla_test sanitizer_canary)
ASAN_EXCLUDE='_NOT_BUILT$|^(deploy_checks|prometheus_e2e|worker_phase_metrics)$'
FUZZERS=(safetensors_fuzzer checkpoint_index_fuzzer config_fuzzer quant_config_fuzzer request_fuzzer
         step_plan_fuzzer)
# TSan: where our threads meet: the checkpoint stream reader's readers and its consumer, the engine thread and its
# callers (fake executor), the coordinator's watcher,
# calls and failover over real gRPC with in-process fake workers, the lock-step leader/followers, the rendezvous
# store and Gloo communicators (comm_peer processes are instrumented too). Built without the model
# (DSV4_BUILD_MODEL=OFF): tests that need dsv4-worker skip or are not selected. Left to the main run: tests with
# tight timing bounds (TSan slows them several times) and the kill/hang/missing-peer tests, whose assertions are
# about failure timing and whose Gloo teardown paths race inside Gloo itself.
TSAN_TARGETS=(worker_test coordinator_test comm_test comm_peer sanitizer_canary checkpoint_test)
TSAN_TESTS='^(StreamReaderTest|Engine|KvManager|Sampler|PageAllocator|RequestValidation|CoordinatorTest|BenchStatsTest|BenchWorkloadTest|WorkerListTest|ParseHostPortTest|LocalCommunicatorTest|BroadcastBytesTest|ValidateRankWorldTest|TcpStoreTest|GlooCommunicatorTest|GlooProcessTest|LockstepTest|RendezvousTest|StepPlanTest)\.|^sanitizer_canary_'
# Also left to the main run: the two tests that observe prometheus-cpp histograms from the engine thread; Debian's
# prometheus-cpp is not built with TSan and its Histogram::Observe mutex is misreported as "unlock of an unlocked mutex".
TSAN_EXCLUDE='^(CoordinatorTest\.PromptTokensCountEachPrefillOnce|Engine\.PromptTokensCountWhatThisWorkerPrefilled|RendezvousTest\.MismatchedCheckpointIsRefused|TcpStoreTest\.WaitTimesOutNamingTheMissingKeys|LockstepTest\.FollowerKilled.*|GlooProcessTest\.(KilledPeer|HungPeer|MissingPeer).*)$'

stage_asan() {
  configure build-asan -DDSV4_SANITIZE=address,undefined -DDSV4_FUZZ=ON
  cmake --build build-asan -j"$JOBS" --target "${ASAN_TARGETS[@]}" "${FUZZERS[@]}"
  # The fuzz targets' corpus replays (label fuzz) run here too: every seed and regression input, once.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure -j"$JOBS" --timeout 600 -LE gpu -E "$ASAN_EXCLUDE")
}

stage_fuzz() {
  if [ ! -x build-asan/fuzz/config_fuzzer ]; then
    configure build-asan -DDSV4_SANITIZE=address,undefined -DDSV4_FUZZ=ON
    cmake --build build-asan -j"$JOBS" --target "${FUZZERS[@]}"
  fi
  FUZZ_JOBS=$JOBS bash scripts/fuzz.sh
}

stage_tsan() {
  configure build-tsan -DDSV4_SANITIZE=thread -DDSV4_BUILD_MODEL=OFF
  cmake --build build-tsan -j"$JOBS" --target "${TSAN_TARGETS[@]}"
  # The preload (abseil and gRPC annotations) and the suppressions reach the child processes the tests start.
  (cd build-tsan &&
     TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$root/tests/sanitizers/tsan.supp" \
     LD_PRELOAD="$root/build-tsan/tests/sanitizers/libdsv4_tsan_sync.so" \
     ctest --output-on-failure -j"$JOBS" --timeout 600 -R "$TSAN_TESTS" -E "$TSAN_EXCLUDE")
}

for s in "${stages[@]}"; do
  start=$(date +%s)
  "stage_$s"
  echo "sanitize: stage $s took $(($(date +%s) - start)) s"
done
