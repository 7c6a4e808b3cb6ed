#!/usr/bin/env bash
# Every gpu-labelled test (ctest -L gpu) on a GPU machine. docs/gpu.md has the whole procedure.
#
#   scripts/gpu-tests.sh local  [BUILD_DIR]          on a GPU machine with this repo's toolchain: build for the
#                                                    local GPU and run `ctest -L gpu`.
#   scripts/gpu-tests.sh bundle [BUILD_DIR] [DIR]    on the build machine (no GPU): build for sm_90a (H100/H200),
#                                                    list the tests `ctest -L gpu` would run, copy their binaries and
#                                                    libraries into DIR (default .gpu/gpu-tests) with DIR/run.sh.
#   bash DIR/run.sh RESULTS_DIR                      on the GPU machine, from the repo root: runs them (one process
#                                                    per test binary, ctest's filters), logs under RESULTS_DIR, and
#                                                    prints "gpu tests: N passed, N failed, N skipped".
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
build=${2:-build-gpu}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/dsv4-ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
case "$mode" in
  local)
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=native
    cmake --build "$build" -j"$(nproc)"
    cd "$build" && exec ctest -L gpu --output-on-failure --timeout 900 ;;
  bundle)
    dir=${3:-.gpu/gpu-tests}
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > /dev/null
    cmake --build "$build" -j"$(nproc)"
    rm -rf "$dir" && mkdir -p "$dir"
    # One line per test binary: binary path, then the ':'-joined gtest filter of its gpu-labelled tests.
    (cd "$build" && ctest -L gpu -N --show-only=json-v1) | python3 -c '
import json, sys, collections
tests = json.load(sys.stdin)["tests"]
by_binary = collections.OrderedDict()
for t in tests:
    cmd = t["command"]
    flt = next(a.split("=", 1)[1] for a in cmd if a.startswith("--gtest_filter="))
    by_binary.setdefault(cmd[0], []).append(flt)
for binary, filters in by_binary.items():
    print(binary, ":".join(filters))
' > "$dir/tests.txt"
    # The programs the process tests start (gpu_worker_test, tp_gpu_test: BinaryPath() under DSV4_BINARY_DIR;
    # decode_bench_gpu_test: the decode bench), in the build folder's layout.
    programs="worker/dsv4-worker tools/generate/dsv4-generate tools/make_checkpoint/dsv4-make-checkpoint
              bench/decode/dsv4-decode-bench"
    bash ../shared/gpu/bundle.sh "$dir" $(cut -d" " -f1 "$dir/tests.txt") $(printf "$build/%s " $programs) > /dev/null
    for p in $programs; do mkdir -p "$dir/$(dirname "$p")" && mv "$dir/bin/$(basename "$p")" "$dir/$p"; done
    sed -i 's#^[^ ]*/#bin/#' "$dir/tests.txt"
    cat > "$dir/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the bundled gpu-labelled tests (made by scripts/gpu-tests.sh bundle). Usage: bash DIR/run.sh RESULTS_DIR
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/tmp/gpu-tests}; mkdir -p "$out"
export LD_LIBRARY_PATH=$here/lib DSV4_SOURCE_DIR=$PWD DSV4_BINARY_DIR=$here NCCL_NVLS_ENABLE=0
passed=0 failed=0 skipped=0
while read -r bin filter; do
  name=$(basename "$bin")
  timeout 900 "$here/$bin" --gtest_filter="$filter" --gtest_brief=1 > "$out/$name.log" 2>&1
  rc=$?
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out/$name.log" | grep -oE '[0-9]+$' || echo 0)
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$out/$name.log" | grep -oE '[0-9]+$' || echo 0)
  f=$(grep -cE '^\[  FAILED  \] [A-Za-z]' "$out/$name.log" || true)
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1   # a crash or timeout with no test marked failed
  echo "$name: rc $rc, $p passed, $f failed, $s skipped"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$out/$name.log" | sed 's/^/  /'
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
done < "$here/tests.txt"
echo "gpu tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
RUN
    du -sh "$dir" | awk '{print "bundle: " $2 " (" $1 "); run there: bash " $2 "/run.sh $OUT"}' ;;
  *)
    echo "usage: scripts/gpu-tests.sh local|bundle [BUILD_DIR] [DIR]" >&2; exit 2 ;;
esac
