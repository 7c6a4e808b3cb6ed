#!/usr/bin/env bash
# Builds this tree for the H200 (sm_90a, build-h200) and bundles what one session's device calls need, under the
# ignored .gpu/ (docs/gpu.md):
#   .gpu/gpu-tests.tar.xz  every gpu-labelled test (scripts/gpu-tests.sh bundle, stripped, xz)
#   .gpu/decode-bench.tar.xz  dsv4-decode-bench, dsv4-gemm-bench, dsv4-ops-bench, sparse_mla_bench, sparse_mla_test
#                          and their libraries, with bench/decode/run_h200.sh (folder decode-bench; also BUNDLE= for
#                          bench/sparse_mla/run_h200.sh: its bin/ holds the sparse-MLA test and bench)
# Both compressed (~23 + 7 MB; the folders are 97 and 28 MB, and the carried tree - working tree + bundles - must
# stay under 64 MiB). Then there: carry [".gpu/gpu-tests.tar.xz", ".gpu/decode-bench.tar.xz"] and run
# bench/session_h200.sh (it unpacks both; suite and A/B steps), or after it
# `BUNDLE=.gpu/decode-bench bash bench/sparse_mla/run_h200.sh`.
#   scripts/bundle-h200.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-h200}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
bundle=../shared/gpu/bundle.sh
[ -x "$bundle" ] || bundle=/work/shared/gpu/bundle.sh
scripts/gpu-tests.sh bundle "$build" .gpu/gpu-tests  # configures for 90a and builds every target
find .gpu/gpu-tests -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true
(cd .gpu && rm -f gpu-tests.tar.xz && tar cJf gpu-tests.tar.xz gpu-tests && rm -rf gpu-tests)
rm -rf .gpu/decode-bench
"$bundle" .gpu/decode-bench "$build/bench/decode/dsv4-decode-bench" "$build/bench/gemm/dsv4-gemm-bench" \
  "$build/bench/ops/dsv4-ops-bench" "$build/bench/sparse_mla/sparse_mla_bench" \
  "$build/tests/sparse_mla/sparse_mla_test" > /dev/null
cp bench/decode/run_h200.sh .gpu/decode-bench/
strip --strip-unneeded .gpu/decode-bench/bin/* 2>/dev/null || true
(cd .gpu && rm -f decode-bench.tar.xz && tar cJf decode-bench.tar.xz decode-bench && rm -rf decode-bench)
du -sh .gpu/gpu-tests.tar.xz .gpu/decode-bench.tar.xz
git ls-files -z | du -ch --files0-from=- 2>/dev/null | tail -1 | awk '{print "tracked tree: " $1}'
