#!/usr/bin/env bash
# Builds dsv4-ops-bench for the H200 (sm_90a, so the sparse-MLA wgmma kernel is in) in build-h200 of this checkout
# and bundles it, with run_h200.sh as run.sh and the commit it was built from, into DEST (default
# /work/main/.gpu/ops-bench). On the GPU machine, from the repository root: bash .gpu/ops-bench/run.sh "$OUT".
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
DEST=${1:-/work/main/.gpu/ops-bench}
export PATH=/usr/local/cuda/bin:$PATH
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache} CCACHE_BASEDIR=$PWD
cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
cmake --build build-h200 -j2 --target dsv4-ops-bench
rm -rf "$DEST/bin" "$DEST/lib"
/work/shared/gpu/bundle.sh "$DEST" build-h200/bench/ops/dsv4-ops-bench
cp bench/ops/run_h200.sh "$DEST/run.sh"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!build*' || echo '+uncommitted')" > "$DEST/COMMIT"
echo "bundled $(cat "$DEST/COMMIT") into $DEST; run there: bash ${DEST#/work/main/}/run.sh \"\$OUT\""
