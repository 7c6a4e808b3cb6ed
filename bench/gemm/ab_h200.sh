#!/usr/bin/env bash
# One device call that A/B-tests a linear-kernel change: the Dense*/Fused* GPU tests of the new tree, then the
# automatic-plan table (dsv4-gemm-bench, T = 8..128, singles and groups, no peers) of the new bundle and of an old
# one in the same run. Here: bundle the new tree as docs/gpu.md says (.gpu/gpu-tests.tar.xz, .gpu/decode-bench) and
# keep the old tree's decode-bench bundle in OLD (default .gpu/next/decode-bench); carry all three.
# There: bash bench/gemm/ab_h200.sh $OUT [OLD]. Here: python3 bench/gemm/ab_compare.py g_new.json g_old.json
set -u; OUT=${1:?usage: ab_h200.sh OUT [OLD_BUNDLE]}; OLD=${2:-.gpu/next/decode-bench}
tar xJf .gpu/gpu-tests.tar.xz -C .gpu
(export LD_LIBRARY_PATH=$PWD/.gpu/gpu-tests/lib DSV4_SOURCE_DIR=$PWD
 timeout 200 .gpu/gpu-tests/bin/cuda_ops_test --gtest_filter='Dense*:Fused*' --gtest_brief=1 > "$OUT/ops.log" 2>&1
 echo "ops rc=$?"; tail -3 "$OUT/ops.log")
for v in new old; do
  D=.gpu/decode-bench; [ $v = old ] && D=$OLD
  LD_LIBRARY_PATH=$PWD/$D/lib timeout 200 $D/bin/dsv4-gemm-bench --config=configs/flash.json --tokens=8,16,32,64,128 \
    --peers=false --variants=false --reps=20 --warmup_ms=2 --json="$OUT/g_$v.json" > "$OUT/g_$v.md" 2> "$OUT/g_$v.err"
  echo "$v rc=$?"
done
