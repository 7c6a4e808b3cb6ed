#!/usr/bin/env bash
# Bundles the GPU serving tests for the project's GPU machine (docs/gpu.md "Serving tests on a GPU machine"): the
# worker, dsv4-generate, dsv4-make-checkpoint and the gpu-labelled serving tests, laid out like the build folder
# (the process tests find the programs under $DSV4_BINARY_DIR), with the shared libraries the machine lacks in lib/
# (copied by the shared bundle.sh, /work/shared/gpu/bundle.sh unless BUNDLE_SH says otherwise).
#
#   scripts/gpu-serve-bundle.sh BUILD_DIR OUT_DIR       # e.g. build-h200 .gpu/gpu-serve
# then on the GPU machine, from the repository root (the process tests read configs/ from DSV4_SOURCE_DIR):
#   export DSV4_SOURCE_DIR=$PWD DSV4_BINARY_DIR=$PWD/OUT_DIR LD_LIBRARY_PATH=$PWD/OUT_DIR/lib
#   OUT_DIR/tests/cuda/cuda_graph_test; OUT_DIR/tests/worker/gpu_worker_test; OUT_DIR/tests/worker/tp_gpu_test
set -euo pipefail
build=${1:?usage: gpu-serve-bundle.sh BUILD_DIR OUT_DIR}
out=${2:?usage: gpu-serve-bundle.sh BUILD_DIR OUT_DIR}
bundle_sh=${BUNDLE_SH:-/work/shared/gpu/bundle.sh}
[ -x "$bundle_sh" ] || { echo "gpu-serve-bundle: $bundle_sh not found (set BUNDLE_SH)" >&2; exit 1; }
files=(worker/dsv4-worker tools/generate/dsv4-generate tools/make_checkpoint/dsv4-make-checkpoint
       tests/worker/gpu_worker_test tests/worker/tp_gpu_test tests/cuda/cuda_graph_test)
for f in "${files[@]}"; do
  [ -x "$build/$f" ] || { echo "gpu-serve-bundle: $build/$f is missing; build it first" >&2; exit 1; }
done
rm -rf "$out"
"$bundle_sh" "$out" "${files[@]/#/$build/}"
for f in "${files[@]}"; do  # the build folder's layout, which BinaryPath() expects
  mkdir -p "$out/$(dirname "$f")"
  mv "$out/bin/$(basename "$f")" "$out/$f"
done
rmdir "$out/bin"
echo "gpu-serve-bundle: $out ready; see the header of $0 for the command on the GPU machine"
