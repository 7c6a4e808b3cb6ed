#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything (CUDA objects too where nvcc
# exists), and runs every test with ctest. GPU tests skip with a message where no GPU is present. Then the
# sanitizer and fuzzing stages (scripts/sanitize.sh: ASan+UBSan tests, bounded fuzzing, TSan tests, each in its
# own build folder); DSV4_SKIP_SANITIZERS=1 skips them.
#   scripts/test.sh            # build into build/ and test
#   BUILD_DIR=build-x scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache}
# Relative paths in the cache key, so clones in other folders (CI) reuse the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release}
cmake --build "$BUILD_DIR" -j"$JOBS"
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$JOBS" --timeout 900)
if [ "${DSV4_SKIP_SANITIZERS:-0}" != 1 ]; then
  JOBS=$JOBS bash scripts/sanitize.sh
fi
