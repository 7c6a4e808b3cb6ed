#!/usr/bin/env bash
# Issue 15 items 4 and 7 on the H200 in one call (bench/RESULTS.md, 2026-12-01 "GPU serving end to end"):
#   info       GPU, cores, memory, the file systems of the data folder and /tmp, the Python modules the e2e test needs
#   ckpt       the small checkpoint (configs/small.json, seed 1) written by dsv4-make-checkpoint
#   disk       raw disk read rate (dd iflag=direct), buffered cold and warm reads of the checkpoint file
#   load_warm  dsv4-load-bench: copy bandwidth pinned / pageable, streamed and mapped loads from the page cache
#   load_cold  the same with the page cache dropped (drop_caches as root, else posix_fadvise DONTNEED) before each
#   medium     a 16-layer synthetic checkpoint (bench/load/medium.json, ~6.5 GB) loaded streamed and mapped, warm
#              and cold (not in the default STEPS)
#   serve      dsv4-worker --backend cuda (production, CUDA graphs) + dsv4-coordinator on the small checkpoint,
#              dsv4-bench greedy and sampled at concurrency 1,4,16,64, then a scrape of the worker's /metrics
#   prom       tests/deploy/prometheus_e2e_test.py with DSV4_E2E_BACKEND=cuda (Debian's prometheus carried along)
#   runmain    scripts/run-main.sh (SKIP_BUILD=1) on the bundled binaries
#   wstream    weight_stream_cuda_test (streamed load = mapped load on the device, byte for byte)
# Layout of the bundle (made by bench/serving/bundle_h200_e2e.sh): bin/ lib/ (bundle.sh), build/ (the build-tree
# paths of the binaries, links made here), scripts/ configs/ tests/deploy/ (this branch's copies), stubs/ (dsv4.v1
# Python stubs), prometheus.xz. Run: bash BUNDLE/run.sh $OUT   (logs in $OUT/logs.tgz; a summary on stdout).
set -u
B=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-${OUT:-/tmp/h200-e2e}}
L=$OUT/logs
mkdir -p "$L"
REPO=$(pwd)
D=${DATA_DIR:-$REPO/.gpu/e2e-data}
mkdir -p "$D"
export LD_LIBRARY_PATH=$B/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s)
STEPS=${STEPS:-info ckpt disk load_warm load_cold serve parallel}
# Overrides for a dry run of the plumbing on a machine without a GPU (CPU backend, tiny config).
CKPT_CONFIG=${CKPT_CONFIG:-configs/small.json}
SERVE_FLAGS=${SERVE_FLAGS:---backend cuda --device 0 --gpu-memory-fraction 0.6 --mode production}
E2E_BACKEND=${E2E_BACKEND:-cuda}
PYTHON=${PYTHON:-python3}

for b in worker/dsv4-worker coordinator/dsv4-coordinator bench/serving/dsv4-bench \
         tools/make_checkpoint/dsv4-make-checkpoint bench/load/dsv4-load-bench tests/cuda/weight_stream_cuda_test; do
  mkdir -p "$B/build/$(dirname "$b")"
  ln -sf "$B/bin/$(basename "$b")" "$B/build/$b"
done
if [ -f "$B/prometheus.xz" ] && [ ! -x "$B/bin/prometheus" ]; then xz -dc "$B/prometheus.xz" > "$B/bin/prometheus" && chmod +x "$B/bin/prometheus"; fi
export PATH=$B/bin:$PATH

# step NAME LIMIT CMD...: runs CMD with a time limit, logs to $L/NAME.log, prints its key lines.
# DEADLINE (s after start, default 185) caps every step, so the summary and logs.tgz are always written.
DEADLINE=${DEADLINE:-185}
step() {
  local name=$1 limit=$2; shift 2
  local s; s=$(date +%s)
  local left=$((DEADLINE - (s - T0)))
  if [ "$left" -lt 5 ]; then echo "=== $name skipped (deadline)" | tee "$L/$name.log"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (limit ${limit}s, at +$((s - T0))s)"
  timeout -k 5 "$limit" bash -c "$*" > "$L/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $(($(date +%s) - s))s" | tee -a "$L/$name.log"
}
drop_caches() { sync; if echo 3 > /proc/sys/vm/drop_caches 2> /dev/null; then echo "drop_caches: done"; else echo "drop_caches: refused (fadvise only)"; fi; }

s_info() {
  nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,pcie.link.gen.max,pcie.link.width.max --format=csv
  nproc; free -g; df -h "$D" /tmp; uname -r
  "$PYTHON" -c "import grpc, google.protobuf, yaml; print('grpc', grpc.__version__, 'protobuf', google.protobuf.__version__)"
  prometheus --version 2>&1 | head -1
}
s_ckpt() { "$B/bin/dsv4-make-checkpoint" --config "$B/$CKPT_CONFIG" --seed 1 --out "$D/small"; ls -la "$D/small"; }
s_disk() {
  local f=$D/small/model.safetensors
  drop_caches
  echo "raw (O_DIRECT):"; dd if="$f" of=/dev/null bs=64M iflag=direct 2>&1 | tail -1
  drop_caches
  echo "buffered, cold:"; dd if="$f" of=/dev/null bs=64M 2>&1 | tail -1
  echo "buffered, warm (page cache):"; dd if="$f" of=/dev/null bs=64M 2>&1 | tail -1
}
s_load_warm() {
  "$B/bin/dsv4-load-bench" --checkpoint "$D/small" --modes streamed,mapped --repeat 2 --threads 4 2>&1 | grep -v "\[info\]"
  "$B/bin/dsv4-load-bench" --checkpoint "$D/small" --modes streamed --repeat 1 --threads 8 --copy_mib 64 2>&1 | grep "^load"
}
s_load_cold() {
  drop_caches
  "$B/bin/dsv4-load-bench" --checkpoint "$D/small" --modes streamed,mapped --repeat 1 --threads 4 --cold --copy_mib 64 2>&1 | grep "^load\|drop"
  drop_caches
  "$B/bin/dsv4-load-bench" --checkpoint "$D/small" --modes streamed --repeat 1 --threads 8 --cold --copy_mib 64 2>&1 | grep "^load"
}
s_medium() {
  "$B/bin/dsv4-make-checkpoint" --config "$B/configs/medium.json" --seed 1 --out "$D/medium" | tail -3
  "$B/bin/dsv4-load-bench" --checkpoint "$D/medium" --modes streamed,mapped --repeat 1 --copy_mib 256 2>&1 | grep -v "\[info\]"
  drop_caches
  "$B/bin/dsv4-load-bench" --checkpoint "$D/medium" --modes streamed,mapped --repeat 1 --cold --copy_mib 64 2>&1 | grep "^load"
}
wait_file() { for _ in $(seq $(($2 * 10))); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
field() { tr ' ' '\n' < "$1" | sed -n "s/^$2=//p"; }
s_serve() {
  local W=$L/serve_worker.log C=$L/serve_coordinator.log
  rm -f "$D/w.ready" "$D/c.ready"
  "$B/bin/dsv4-worker" --checkpoint "$D/small" $SERVE_FLAGS \
    --max-batch 64 --max-context 4096 --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --ready-file "$D/w.ready" \
    --group 0 --rank 0 --world 1 > "$W" 2>&1 &
  local wp=$!
  wait_file "$D/w.ready" 150 || { echo "worker not ready"; tail -30 "$W"; kill $wp; return 1; }
  echo "worker ready at +$(($(date +%s) - T0))s: $(cat "$D/w.ready")"
  "$B/bin/dsv4-coordinator" --listen 127.0.0.1:0 --workers "$(field "$D/w.ready" grpc)" --metrics-listen 127.0.0.1:0 \
    --ready-file "$D/c.ready" --min-ready-groups 1 > "$C" 2>&1 &
  local cp=$!
  wait_file "$D/c.ready" 30 || { echo "coordinator not ready"; tail -30 "$C"; kill $cp $wp; return 1; }
  local target; target=$(field "$D/c.ready" grpc)
  for mode in greedy:0 sampled:0.8; do
    echo "--- dsv4-bench ${mode%%:*}: --num-prompts 64 --random-input-len 128 --random-output-len 64 --random-range-ratio 0.5 --concurrency 1,4,16,64 --temperature ${mode##*:}"
    timeout 75 "$B/bin/dsv4-bench" --target "$target" --num-prompts 64 --random-input-len 128 --random-output-len 64 \
      --random-range-ratio 0.5 --concurrency 1,4,16,64 --temperature "${mode##*:}" \
      --output-json "$L/bench_${mode%%:*}.json" 2>&1 | tee "$L/bench_${mode%%:*}.txt" | grep -v "^\s*$\|^{" | tail -n 30
  done
  "$PYTHON" - "$(field "$D/w.ready" metrics)" > "$L/serve_metrics.txt" <<'PY'
import sys, urllib.request
print(urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode())
PY
  grep -E "^dsv4_(decode_gpu_seconds_total|attention_time_share|startup_)" "$L/serve_metrics.txt"
  kill -TERM $cp; sleep 0.5; kill -TERM $wp; wait $wp $cp
  echo "--- worker start-up log:"
  grep -E "weights:|memory|KV pools|CUDA graphs|graph|phase timing|serving|SERVING|replay|backend" "$W" | head -40
}
s_prom() {
  DSV4_E2E_BACKEND=$E2E_BACKEND DSV4_E2E_STUBS=$B/stubs DSV4_BINARY_DIR=$B/build DSV4_SOURCE_DIR=$REPO \
    "$PYTHON" "$B/tests/deploy/prometheus_e2e_test.py"
}
s_runmain() { BUILD_DIR=build SKIP_BUILD=1 NUM_PROMPTS=8 CONCURRENCY=1,4 OUTPUT_LEN=16 STARTUP_TIMEOUT=120 bash "$B/scripts/run-main.sh"; }
s_wstream() { DSV4_SOURCE_DIR=$B "$B/bin/weight_stream_cuda_test"; }

export B OUT L REPO D T0 CKPT_CONFIG SERVE_FLAGS E2E_BACKEND PYTHON
export -f drop_caches wait_file field s_medium s_info s_ckpt s_disk s_load_warm s_load_cold s_serve s_prom s_runmain s_wstream
for s in $STEPS; do
  case $s in
    info) step info 30 s_info ;;
    ckpt) step ckpt 90 s_ckpt ;;
    disk) step disk 40 s_disk ;;
    load_warm) step load_warm 60 s_load_warm ;;
    load_cold) step load_cold 60 s_load_cold ;;
    medium) step medium 120 s_medium ;;
    serve) step serve 200 s_serve ;;
    parallel)
      step prom 150 s_prom &
      step runmain 150 s_runmain &
      step wstream 120 s_wstream &
      wait ;;
    *) step "$s" 120 "s_$s" ;;
  esac
done
echo "=== total $(($(date +%s) - T0))s"
for f in info disk load_warm load_cold medium; do [ -f "$L/$f.log" ] || continue; echo "----- $f"; grep -v "^\[" "$L/$f.log" | tail -n 25; done
echo "----- serve"; grep -E "^(===|---|run |concurrency=|worker ready|dsv4_decode|dsv4_attention|dsv4_startup_(weight|graph_capture_seconds|total))|weights:|CUDA graphs|max concurrent|memory plan|^  (weights|KV|graphs|workspace|left|other)" "$L/serve.log" | grep -v "^{" | head -90
echo "----- prom"; grep -E "^(GPU|OK|FAIL|Ran|===|AssertionError|Error)|Error" "$L/prom.log" | head -20
echo "----- runmain"; grep -E "run-main|^concurrency=|^run |===" "$L/runmain.log" | head -30
echo "----- wstream"; grep -E "identical|OK|FAILED|PASSED|SKIPPED|===" "$L/wstream.log" | head -12
tar czf "$OUT/logs.tgz" -C "$L" . 2> /dev/null
