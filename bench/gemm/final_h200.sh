#!/usr/bin/env bash
# One device call for a linear-kernel change: the whole gpu suite, the TP 4 decode step, and the automatic-plan A/B
# against an older bundle (OLD). Carry .gpu/gpu-tests.tar.xz, .gpu/decode-bench and OLD.
set -u; OUT=${1:?usage: final_h200.sh OUT OLD_BUNDLE}; OLD=${2:?old decode-bench bundle}
bash bench/session_h200.sh "$OUT" suite | tail -13
D=.gpu/decode-bench
LD_LIBRARY_PATH=$PWD/$D/lib timeout 60 $D/bin/dsv4-decode-bench --simulate-rank=0 --simulate-world=4 --comm-busbw-gbs=146 \
  --comm-latency-us=20 --context=8192 --batches=1,8,32,64,128 --json="$OUT/decode.json" > "$OUT/decode.txt" 2>&1
echo "decode rc=$?"; grep -E '^\| *[0-9]+ \| 8192' "$OUT/decode.txt"
for v in new old; do
  B=$D; [ $v = old ] && B=$OLD
  LD_LIBRARY_PATH=$PWD/$B/lib timeout 100 $B/bin/dsv4-gemm-bench --config=configs/flash.json --tokens=33,64,128 \
    --peers=false --variants=false --reps=20 --warmup_ms=2 --json="$OUT/g_$v.json" > "$OUT/g_$v.md" 2> "$OUT/g_$v.err"
  echo "$v rc=$?"
done
