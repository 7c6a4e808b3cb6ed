#!/usr/bin/env bash
# One device call that checks and measures a tree on the H200 (used by the fourth session; reusable): the whole
# gpu-labelled suite, the decode bench runs, and the single-linear table with the multi-weight kernel's builds.
# Here:  scripts/gpu-tests.sh bundle build-h200 .gpu/gpu-tests (strip, tar cJf .gpu/gpu-tests.tar.xz gpu-tests),
#        /work/shared/gpu/bundle.sh .gpu/decode-bench build-h200/bench/decode/dsv4-decode-bench \
#          build-h200/bench/gemm/dsv4-gemm-bench build-h200/bench/ops/dsv4-ops-bench \
#          && cp bench/decode/run_h200.sh .gpu/decode-bench/
# There: bash bench/session_h200.sh $OUT [STEPS]   (carry .gpu/gpu-tests.tar.xz and .gpu/decode-bench or, as
#        scripts/bundle-h200.sh makes it in one go, .gpu/decode-bench.tar.xz)
# STEPS: any of suite decode singles decode_a pdl norm_rope hc_norm wgmma_linear (default: the first
#        four, ~8 minutes). Logs under OUT.
set -u
OUT=${1:?usage: session_h200.sh OUT [STEPS]}; STEPS=${2:-"suite decode singles decode_a"}
mkdir -p "$OUT"
# scripts/bundle-h200.sh carries the decode bench compressed; unpack it once.
[ -d .gpu/decode-bench ] || { [ -f .gpu/decode-bench.tar.xz ] && tar xJf .gpu/decode-bench.tar.xz -C .gpu; }
for s in $STEPS; do
  echo "=== $s $(date +%T)"
  case $s in
    suite) rm -rf .gpu/gpu-tests && tar xJf .gpu/gpu-tests.tar.xz -C .gpu
           timeout 300 bash .gpu/gpu-tests/run.sh "$OUT/suite" > "$OUT/suite.txt" 2>&1; echo "rc=$?"; cat "$OUT/suite.txt" ;;
    decode) bash .gpu/decode-bench/run_h200.sh "$OUT" "b c d"; mv "$OUT/decode-bench.tgz" "$OUT/decode-bcd.tgz" ;;
    decode_a) bash .gpu/decode-bench/run_h200.sh "$OUT" "a"; mv "$OUT/decode-bench.tgz" "$OUT/decode-a.tgz" ;;
    singles) LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 150 .gpu/decode-bench/bin/dsv4-gemm-bench \
               --config=configs/flash.json --groups=false --peers=false --tokens=1,2,4,8,16 --reps=20 --warmup_ms=2 \
               --json="$OUT/singles.json" > "$OUT/singles.md" 2> "$OUT/singles.err"; echo "rc=$?" ;;
    pdl) for v in 0 1; do  # programmatic dependent launch off / on (kernels/cuda/pdl.h), TP 4 rank 0, 43 layers
           DSV4_PDL=$v LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 90 .gpu/decode-bench/bin/dsv4-decode-bench \
             --config=configs/flash.json --simulate-rank=0 --simulate-world=4 --comm-busbw-gbs=146 \
             --comm-latency-us=20 --context=8192 --batches=1,8,64 --json="$OUT/pdl_$v.json" > "$OUT/pdl_$v.txt" 2>&1
           echo "DSV4_PDL=$v rc=$?"; grep -E '^\| *(1|8|64) \|' "$OUT/pdl_$v.txt"
         done ;;
    norm_rope) for v in 0 1 0 1; do  # RmsNorm + RoPE as two kernels / one (kernels/cuda/dense.cc, DSV4_NORM_ROPE)
                 DSV4_NORM_ROPE=$v LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 120 .gpu/decode-bench/bin/dsv4-decode-bench \
                   --config=configs/flash.json --simulate-rank=0 --simulate-world=4 --comm-busbw-gbs=146 \
                   --comm-latency-us=20 --context=8192 --batches=1,8,64 >> "$OUT/norm_rope_$v.txt" 2>&1
                 echo "DSV4_NORM_ROPE=$v rc=$?"; tail -n 30 "$OUT/norm_rope_$v.txt" | grep -E '^\| *(1|8|64) \|'
               done ;;
    hc_norm) for v in 0 1 0 1; do  # the sublayer norm as its own kernel / inside the mHC pre (kernels/cuda/hc.cc, DSV4_HC_NORM)
               DSV4_HC_NORM=$v LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 120 .gpu/decode-bench/bin/dsv4-decode-bench \
                 --config=configs/flash.json --simulate-rank=0 --simulate-world=4 --comm-busbw-gbs=146 \
                 --comm-latency-us=20 --context=8192 --batches=1,8,64 >> "$OUT/hc_norm_$v.txt" 2>&1
               echo "DSV4_HC_NORM=$v rc=$?"; tail -n 30 "$OUT/hc_norm_$v.txt" | grep -E '^\| *(1|8|64) \|'
             done ;;
    wgmma_linear)  # the sm_90a wgmma FP8 linear (kernels/cuda/linear_wgmma.cu): single weights and fused groups
      # at 1-128 tokens with its variants beside the mma.sync plan ("mma", "wgmma", "wgmma rt1", the other token
      # tile, clusters; below 33 tokens only as variants), then the
      # TP 4 step at B = 32-256 with it off / on (DSV4_LINEAR_WGMMA)
      LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 300 .gpu/decode-bench/bin/dsv4-gemm-bench \
        --config=configs/flash.json --peers=false --tokens=1,8,16,32,64,128 --reps=20 --warmup_ms=2 \
        --json="$OUT/wgmma.json" > "$OUT/wgmma.md" 2> "$OUT/wgmma.err"; echo "gemm rc=$?"
      for v in 0 1; do
        DSV4_LINEAR_WGMMA=$v LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 120 .gpu/decode-bench/bin/dsv4-decode-bench \
          --config=configs/flash.json --simulate-rank=0 --simulate-world=4 --comm-busbw-gbs=146 \
          --comm-latency-us=20 --context=8192 --batches=32,64,128,256 --json="$OUT/wgmma_step_$v.json" \
          > "$OUT/wgmma_step_$v.txt" 2>&1
        echo "DSV4_LINEAR_WGMMA=$v rc=$?"; grep -E '^\| *(32|64|128|256) \|' "$OUT/wgmma_step_$v.txt"
      done ;;
    *) echo "unknown step $s" ;;
  esac
done
