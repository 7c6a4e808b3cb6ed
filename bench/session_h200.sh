#!/usr/bin/env bash
# One device call that checks and measures a tree on the H200 (used by the fourth session; reusable): the whole
# gpu-labelled suite, the decode bench runs, and the single-linear table with the multi-weight kernel's builds.
# Here:  scripts/bundle-h200.sh (builds build-h200 for sm_90a and makes both bundles; the one recipe)
# There: bash bench/session_h200.sh $OUT [STEPS]   (carry .gpu/gpu-tests.tar.xz and .gpu/decode-bench.tar.xz)
# STEPS: any of suite decode singles decode_a pdl norm_rope hc_norm wgmma_linear wgmma_ncu memcheck_linear wgmma_ab
#        (default: the first four, ~8 minutes). Logs under OUT.
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
    wgmma_ncu)  # ncu of the wgmma linear (issue 14's account of what limits it): wq_b and wo_b at 64 / 128 tokens,
      # one eager launch each (dsv4-gemm-bench --once=wgmma), full set with per-SASS-instruction samples; with
      # AB_VAR set, once per value in NCU_VALUES (AB_VAR=v for each; default one run as the tree is)
      for v in ${NCU_VALUES:-1}; do
        env ${AB_VAR:+$AB_VAR=$v} LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 240 ncu --clock-control none --set full \
          --import-source yes -k regex:LinearWgmma -o "$OUT/wgmma_ncu_$v" .gpu/decode-bench/bin/dsv4-gemm-bench \
          --config=configs/flash.json --tp=1 --only=wq_b,wo_b --tokens=64,128 --groups=false --fused=false \
          --once=wgmma > "$OUT/wgmma_ncu_$v.log" 2>&1
        echo "ncu ${AB_VAR:-}=$v rc=$?"; grep -E '^once:' "$OUT/wgmma_ncu_$v.log"
        ncu --import "$OUT/wgmma_ncu_$v.ncu-rep" --page details > "$OUT/wgmma_ncu_$v.txt" 2>&1
        ncu --import "$OUT/wgmma_ncu_$v.ncu-rep" --page source --print-source sass --csv > "$OUT/wgmma_ncu_sass_$v.csv" 2>&1
        grep -E 'Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|L2 Hit' \
          "$OUT/wgmma_ncu_$v.txt" | head -40
      done ;;
    memcheck_linear)  # compute-sanitizer memcheck of the wgmma and fused linears' GPU tests
      [ -d .gpu/gpu-tests ] || tar xJf .gpu/gpu-tests.tar.xz -C .gpu
      LD_LIBRARY_PATH=.gpu/gpu-tests/lib DSV4_SOURCE_DIR=$PWD DSV4_BINARY_DIR=.gpu/gpu-tests timeout 400 \
        compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/gpu-tests/bin/cuda_ops_test \
        --gtest_filter='WgmmaLinear*:FusedLinear*' --gtest_brief=1 > "$OUT/memcheck_linear.txt" 2>&1
      echo "memcheck rc=$?"; tail -4 "$OUT/memcheck_linear.txt" ;;
    wgmma_ab)  # an A/B of the wgmma linear by the environment variable AB_VAR = AB_ON / AB_OFF (default
      # DSV4_LINEAR_WGMMA = 1 / 0: the wgmma kernel on / off; branch wgmma-ws: DSV4_LINEAR_WGMMA_WS): its tests with
      # AB_ON, single weights at 64 / 128 tokens both ways, the step alternated
      [ -d .gpu/gpu-tests ] || tar xJf .gpu/gpu-tests.tar.xz -C .gpu
      V=${AB_VAR:-DSV4_LINEAR_WGMMA}; ON=${AB_ON:-1}; OFF=${AB_OFF:-0}
      env $V=$ON LD_LIBRARY_PATH=.gpu/gpu-tests/lib DSV4_SOURCE_DIR=$PWD DSV4_BINARY_DIR=.gpu/gpu-tests \
        timeout 120 .gpu/gpu-tests/bin/cuda_ops_test --gtest_filter='WgmmaLinear*:FusedLinear*' --gtest_brief=1 \
        > "$OUT/ab_test_$ON.txt" 2>&1; echo "$V=$ON tests rc=$?"; tail -3 "$OUT/ab_test_$ON.txt"
      for v in $ON $OFF; do
        env $V=$v LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 150 .gpu/decode-bench/bin/dsv4-gemm-bench \
          --config=configs/flash.json --peers=false --variants=false --tokens=64,128 --reps=20 --warmup_ms=2 \
          --json="$OUT/ab_gemm_$v.json" > "$OUT/ab_gemm_$v.md" 2> "$OUT/ab_gemm_$v.err"; echo "gemm rc=$?"
      done
      for v in $ON $OFF $ON $OFF; do
        env $V=$v LD_LIBRARY_PATH=.gpu/decode-bench/lib timeout 100 .gpu/decode-bench/bin/dsv4-decode-bench \
          --config=configs/flash.json --simulate-rank=0 --simulate-world=4 --comm-busbw-gbs=146 \
          --comm-latency-us=20 --context=8192 --batches=${AB_BATCHES:-48,64,128,256} >> "$OUT/ab_step_$v.txt" 2>&1
        echo "$V=$v rc=$?"; tail -n 30 "$OUT/ab_step_$v.txt" | grep -E '^\| *(32|48|64|96|128|256) \|'
      done ;;
    *) echo "unknown step $s" ;;
  esac
done
