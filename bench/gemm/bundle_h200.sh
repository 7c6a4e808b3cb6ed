#!/usr/bin/env bash
# Builds dsv4-gemm-bench and the linear's test binaries for the H200 (sm_90a) in build-h200 of this checkout and
# bundles them, with run_h200.sh as run.sh and the commit they were built from, into DEST (default
# /work/main/.gpu/fast-gemm). cuBLASLt is not bundled (the bench dlopens the GPU machine's own).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
DEST=${1:-/work/main/.gpu/fast-gemm}
export PATH=/usr/local/cuda/bin:$PATH
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache} CCACHE_BASEDIR=$PWD
cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-h200 -j2 --target dsv4-gemm-bench cuda_ops_test cuda_model_test
rm -rf "$DEST/bin" "$DEST/lib"
/work/shared/gpu/bundle.sh "$DEST" build-h200/bench/gemm/dsv4-gemm-bench build-h200/tests/cuda/cuda_ops_test \
  build-h200/tests/cuda/cuda_model_test
cp bench/gemm/run_h200.sh "$DEST/run.sh"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!build*' || echo '+uncommitted')" > "$DEST/COMMIT"
echo "bundled $(cat "$DEST/COMMIT") into $DEST; run there: bash ${DEST#/work/main/}/run.sh \"\$OUT\""
