#!/usr/bin/env bash
# One device call: the FP8/BF16 linear table with every plan variant and the cuBLASLt peers (the data AutoLinearPlan's
# choices rest on), then the TP 4 decode step (run b). Carry .gpu/decode-bench; there: bash bench/gemm/variants_h200.sh $OUT
set -u; OUT=${1:?usage: variants_h200.sh OUT}
D=.gpu/decode-bench
LD_LIBRARY_PATH=$PWD/$D/lib timeout 300 $D/bin/dsv4-gemm-bench --config=configs/flash.json --tokens=${TOKENS:-8,16,32,64,128} \
  --groups=false --reps=20 --warmup_ms=2 --json=$OUT/variants.json > $OUT/variants.md 2> $OUT/variants.err; echo "variants rc=$?"
bash $D/run_h200.sh $OUT b; echo "decode rc=$?"
