#!/usr/bin/env bash
# Bundles what bench/serving/h200_e2e.sh runs on the H200 (issue 15 items 4 and 7) into OUT (and OUT.tar.xz, small
# enough for the run tool's carry limit): the stripped binaries of BUILD (a CUDA build) with the shared libraries the
# GPU machine lacks (/work/shared/gpu/bundle.sh), this tree's run-main.sh, configs and deploy tests, the dsv4.v1
# Python stubs (the GPU machine has grpcio but no protoc), Debian's prometheus (xz) and h200_e2e.sh as run.sh.
#   bench/serving/bundle_h200_e2e.sh build-h200 /work/main/.gpu/gpu-serve2
# There: tar xJf .gpu/gpu-serve2.tar.xz -C .gpu && bash .gpu/gpu-serve2/run.sh $OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: bundle_h200_e2e.sh BUILD_DIR OUT_DIR}
out=${2:?usage: bundle_h200_e2e.sh BUILD_DIR OUT_DIR}
rm -rf "$out" "$out.tar.xz"
"${BUNDLE_SH:-/work/shared/gpu/bundle.sh}" "$out" "$build/worker/dsv4-worker" "$build/coordinator/dsv4-coordinator" \
  "$build/bench/serving/dsv4-bench" "$build/tools/make_checkpoint/dsv4-make-checkpoint" \
  "$build/bench/load/dsv4-load-bench" "$build/tests/cuda/weight_stream_cuda_test"
strip "$out"/bin/* "$out"/lib/* 2> /dev/null || true
mkdir -p "$out/scripts" "$out/configs" "$out/tests/deploy" "$out/stubs"
cp scripts/run-main.sh "$out/scripts/"
cp configs/*.json bench/load/medium.json "$out/configs/"
cp tests/deploy/*.py "$out/tests/deploy/"
cp bench/serving/h200_e2e.sh "$out/run.sh"
protoc -Iproto --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" --python_out="$out/stubs" \
  --grpc_python_out="$out/stubs" proto/dsv4/v1/generate.proto proto/dsv4/v1/coordinator.proto proto/dsv4/v1/worker.proto
xz -T2 -6 -c "$(command -v prometheus)" > "$out/prometheus.xz"
tar -C "$(dirname "$out")" -cJf "$out.tar.xz" "$(basename "$out")"
du -sh "$out" "$out.tar.xz"
