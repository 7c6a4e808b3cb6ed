#!/usr/bin/env bash
# The README's main command: the whole service on this machine, measured.
#   1. installs missing Debian packages and builds the four programs it needs (into build/, like test.sh);
#   2. writes the tiny checkpoint (configs/tiny.json, seed 1);
#   3. starts two worker groups (on the GPU when nvidia-smi lists one, else the CPU; BACKEND=cpu|cuda forces it)
#      and the coordinator on loopback ports;
#   4. runs dsv4-bench against the coordinator: a short concurrency sweep of random prompts;
#   5. prints the results table (and JSON), a few coordinator metrics, and stops every process it started.
#
#   scripts/run-main.sh                      # defaults: 24 prompts per point, concurrency 1,4,16
#   NUM_PROMPTS=64 CONCURRENCY=1,8,32 INPUT_LEN=256 OUTPUT_LEN=64 scripts/run-main.sh
#   BUILD_DIR=build-x SKIP_BUILD=1 scripts/run-main.sh
# Logs, the checkpoint and bench.json stay in the run folder it prints (under $TMPDIR) for inspection.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

BUILD_DIR=${BUILD_DIR:-build}
NUM_PROMPTS=${NUM_PROMPTS:-24}
CONCURRENCY=${CONCURRENCY:-1,4,16}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-32}
RANGE_RATIO=${RANGE_RATIO:-0.5}
WORKER_THREADS=${WORKER_THREADS:-1}  # per worker; the two groups share the machine's cores
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-300}
BACKEND=${BACKEND:-auto}
if [ "$BACKEND" = auto ]; then
  if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then BACKEND=cuda; else BACKEND=cpu; fi
fi
case "$BACKEND" in
  # Both groups share device 0: each takes a third of its memory (weights, workspace, graphs and KV pools).
  cuda) BACKEND_FLAGS=(--backend cuda --device 0 --gpu-memory-fraction 0.33) ;;
  cpu) BACKEND_FLAGS=(--backend cpu --threads "$WORKER_THREADS") ;;
  *) echo "run-main: BACKEND must be auto, cpu or cuda, got '$BACKEND'" >&2; exit 2 ;;
esac

if [ -z "${SKIP_BUILD:-}" ]; then
  bash scripts/install-deps.sh
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache}
  [ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} > /dev/null
  cmake --build "$BUILD_DIR" -j"${JOBS:-$(nproc)}" \
    --target dsv4-make-checkpoint dsv4-worker dsv4-coordinator dsv4-bench
fi
BIN=$ROOT/$BUILD_DIR
for b in tools/make_checkpoint/dsv4-make-checkpoint worker/dsv4-worker coordinator/dsv4-coordinator \
         bench/serving/dsv4-bench; do
  [ -x "$BIN/$b" ] || { echo "run-main: $BIN/$b is missing (build failed?)" >&2; exit 1; }
done

RUN=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-main.XXXXXX")
PIDS=()
cleanup() {
  local rc=$?
  # Graceful first (SIGTERM drains), then kill whatever is left after 10 s.
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do
    local alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "run-main: stopped ${#PIDS[@]} processes; logs in $RUN"
  exit $rc
}
trap cleanup EXIT INT TERM

# wait_ready FILE PID NAME: until FILE holds "grpc=... metrics=...", or the process dies, or the timeout.
wait_ready() {
  local file=$1 pid=$2 name=$3
  for _ in $(seq $((STARTUP_TIMEOUT * 10))); do
    [ -s "$file" ] && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "run-main: $name exited during start-up; last log lines:" >&2
      tail -n 20 "$RUN/$name.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "run-main: $name not ready after ${STARTUP_TIMEOUT}s; last log lines:" >&2
  tail -n 20 "$RUN/$name.log" >&2
  return 1
}
field() { tr ' ' '\n' < "$1" | sed -n "s/^$2=//p"; }

echo "run-main: run folder $RUN; workers on the $BACKEND backend"
t0=$(date +%s%N)
"$BIN/tools/make_checkpoint/dsv4-make-checkpoint" --config configs/tiny.json --seed 1 --out "$RUN/ckpt" \
  > "$RUN/make_checkpoint.log" 2>&1 || { tail -n 20 "$RUN/make_checkpoint.log" >&2; exit 1; }
echo "run-main: tiny checkpoint written ($(du -sh "$RUN/ckpt" | cut -f1))"

WORKERS=()
for g in 0 1; do
  "$BIN/worker/dsv4-worker" --checkpoint "$RUN/ckpt" --listen 127.0.0.1:0 "${BACKEND_FLAGS[@]}" --max-batch 32 \
    --max-context 4096 --kv-pages 512 --prefill-chunk 256 --mode exact \
    --group "$g" --rank 0 --world 1 --metrics-listen 127.0.0.1:0 --ready-file "$RUN/worker$g.ready" \
    --drain-timeout 30 > "$RUN/worker$g.log" 2>&1 &
  PIDS+=($!)
done
for g in 0 1; do
  wait_ready "$RUN/worker$g.ready" "${PIDS[$g]}" "worker$g"
  WORKERS+=("$(field "$RUN/worker$g.ready" grpc)")
  echo "run-main: worker group $g serving on ${WORKERS[$g]} with the $BACKEND backend" \
    "(metrics $(field "$RUN/worker$g.ready" metrics))"
done

"$BIN/coordinator/dsv4-coordinator" --listen 127.0.0.1:0 --workers "$(IFS=,; echo "${WORKERS[*]}")" \
  --metrics-listen 127.0.0.1:0 --ready-file "$RUN/coordinator.ready" --min-ready-groups 2 --drain-timeout 30 \
  > "$RUN/coordinator.log" 2>&1 &
PIDS+=($!)
wait_ready "$RUN/coordinator.ready" "${PIDS[2]}" coordinator
TARGET=$(field "$RUN/coordinator.ready" grpc)
COORD_METRICS=$(field "$RUN/coordinator.ready" metrics)
startup_ms=$((($(date +%s%N) - t0) / 1000000))
echo "run-main: coordinator serving on $TARGET (metrics $COORD_METRICS); start-up took ${startup_ms} ms"

echo "run-main: dsv4-bench --num-prompts $NUM_PROMPTS --random-input-len $INPUT_LEN" \
  "--random-output-len $OUTPUT_LEN --random-range-ratio $RANGE_RATIO --concurrency $CONCURRENCY"
bench_rc=0
"$BIN/bench/serving/dsv4-bench" --target "$TARGET" --num-prompts "$NUM_PROMPTS" --random-input-len "$INPUT_LEN" \
  --random-output-len "$OUTPUT_LEN" --random-range-ratio "$RANGE_RATIO" --concurrency "$CONCURRENCY" \
  --output-json "$RUN/bench.json" || bench_rc=$?

# A few of the coordinator's own series, read over plain HTTP (bash /dev/tcp; no curl needed).
host=${COORD_METRICS%:*}; port=${COORD_METRICS##*:}
if exec 3<>"/dev/tcp/$host/$port"; then
  printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$host" >&3
  echo "run-main: coordinator metrics:"
  grep -E '^dsv4_(request_finished_total|generation_tokens_total|prompt_tokens_total|coordinator_ready_groups|coordinator_failovers_total)\{' <&3 \
    | sed 's/^/  /' || true
  exec 3<&-
fi
exit $bench_rc
