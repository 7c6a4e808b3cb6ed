#!/usr/bin/env bash
# One device call for issues 7 / 17 (see docs/gpu.md): GPU tests, the benchmark, optional sanitizer / ncu / SASS
# passes, with every log under $OUT. Run from the repository root on the GPU machine after bundling a build
# for sm_90a (the wgmma kernel is only built there):
#   STEPS="test bench" bash bench/sparse_mla/run_h200.sh
# Steps: test, memcheck, racecheck, bench, bench_heads, bench_w8 (the 8-warp kernel), bench_mtiles (wide
# kernel with 16- / 32-head blocks at small batch), base (a baseline build bundled as bin/sparse_mla_bench_base,
# same-run comparison), bench_pdl (combine with programmatic dependent launch), ncu_combine (the combine kernel
# of the baseline and this build at NCU_BATCH), sweep32 (split counts at B = 32), comm (NCCL comm_gpu_test, if bundled), ncu,
# ncu_stalls, sass, sass8 (spill instructions of the 8-warp 64-head kernel, with context), ncu_dram (HBM bytes
# read by the main kernel at H = 64 and 128, NCU_BATCH), bench_odd (batches 1..128 incl. non-powers of two,
# this build and the baseline), smoke_ws (the warp-specialised kernel's tests alone, short timeout), sass_ws
# (setmaxnreg / barrier / spill instructions of that kernel), bench_ws (the plan against the fourth pass's
# two-warpgroup wgmma kernel, same binary), memcheck_ws / racecheck_ws, bench_cluster (sixth pass: the plan's
# cluster merge against the combine kernel, same binary; CL_HEADS, CL_BATCHES), memcheck_cluster /
# racecheck_cluster. BUNDLE: the bundle folder.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
B=${BUNDLE:-.gpu/mla4}
export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
STEPS=${STEPS:-"test bench"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
for step in $STEPS; do
  echo "=== $step ($(date +%T))"
  case $step in
    test) timeout 240 $B/bin/sparse_mla_test --gtest_color=no > "$OUT/test.txt" 2>&1
          echo "rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|rel_err\(global\)" "$OUT/test.txt" | grep -E "FAILED|PASSED|SKIPPED" | head -30 ;;
    memcheck) timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/sparse_mla_test \
          --gtest_filter='*split130*:*B4_H64_K128p512_P64x64_holes_tile16_split3:*B3_H32*:*B4_H64_K5p7*:*B16_H64_K64p448*:*B2_*_w16_m4:*B16_H128*m2:*_wgmma:*B48_H64*:*B5_H64*:*B3_H64_K128p872*:*B24_H32*' \
          > "$OUT/memcheck.txt" 2>&1; echo "rc=$?"; tail -4 "$OUT/memcheck.txt" ;;
    racecheck) timeout 180 compute-sanitizer --tool racecheck --error-exitcode 9 $B/bin/sparse_mla_test \
          --gtest_filter='*split130*:*B1_H16_K128p256*:*B3_H16*:*B2_*_w16_m4:*B1_H64_K128p512*_m1:*B1_H64_K128p512_P64x64_holes_wgmma:*B5_H64*:*B4_H64_K5p7*_wgmma:*B3_H64_K128p872*' \
          > "$OUT/racecheck.txt" 2>&1; echo "rc=$?"; tail -4 "$OUT/racecheck.txt" ;;
    bench) timeout 240 $B/bin/sparse_mla_bench ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1; echo "rc=$?"; cat "$OUT/bench.txt" ;;
    base) timeout 120 $B/bin/sparse_mla_bench_base --kernels=mma --batches=${BASE_BATCHES:-1,16,32,64,128} --mma_peak=false \
          --reps=50 > "$OUT/bench_base.txt" 2>&1; echo "rc=$? (baseline binary)"; grep "^| [0-9]" "$OUT/bench_base.txt" ;;
    bench_pdl) timeout 120 $B/bin/sparse_mla_bench --pdl=1 --kernels=mma --batches=${PDL_BATCHES:-1,4,16,32,64} --mma_peak=false \
          --reps=50 > "$OUT/bench_pdl.txt" 2>&1; echo "rc=$? (combine with PDL)"; grep "^| [0-9]" "$OUT/bench_pdl.txt" ;;
    ncu_combine) for bin in sparse_mla_bench_base sparse_mla_bench; do timeout 100 ncu --clock-control none -k regex:Combine -c 1 \
          --section SpeedOfLight $B/bin/$bin --batches=${NCU_BATCH:-32} --reps=1 --kernels=mma --pool_mb=100 --mma_peak=false \
          > "$OUT/ncu_combine_$bin.txt" 2>&1; echo "rc=$? $bin"; grep -E "Duration|DRAM Through|Memory Through" "$OUT/ncu_combine_$bin.txt"; done ;;
    sweep32) for sp in 2 3 4 5 6 8; do timeout 60 $B/bin/sparse_mla_bench --warps=8 --splits=$sp --kernels=mma --batches=32 \
          --mma_peak=false --reps=50 2>&1 | grep "^| 32" | sed "s/^/splits=$sp /"; done | tee "$OUT/sweep32.txt" ;;
    comm) timeout 120 $B/bin/comm_gpu_test --gtest_color=no > "$OUT/comm.txt" 2>&1; echo "rc=$?"; grep -E "^\[" "$OUT/comm.txt" | tail -12 ;;
    bench_w16) timeout 120 $B/bin/sparse_mla_bench --warps=16 --m_tiles=4 --kernels=mma --batches=8,16,32,64,128 \
          --mma_peak=false --reps=50 > "$OUT/bench_w16.txt" 2>&1; echo "rc=$?"; tail -8 "$OUT/bench_w16.txt" ;;
    bench_w8) timeout 120 $B/bin/sparse_mla_bench --warps=8 --kernels=mma --batches=1,32,128 --mma_peak=false \
          --reps=50 > "$OUT/bench_w8.txt" 2>&1; echo "rc=$?"; tail -6 "$OUT/bench_w8.txt" ;;
    bench_mtiles) for m in 1 2; do timeout 120 $B/bin/sparse_mla_bench --m_tiles=$m --kernels=mma \
          --batches=${MT_BATCHES:-1,4,16,32} --mma_peak=false --reps=50 > "$OUT/bench_m$m.txt" 2>&1; echo "rc=$?"
          tail -6 "$OUT/bench_m$m.txt"; done ;;
    bench_heads) for h in 16 128; do timeout 120 $B/bin/sparse_mla_bench --heads=$h --batches=1,32,128 --reps=50 ${HEADS_ARGS:-} \
          > "$OUT/bench_h$h.txt" 2>&1; echo "rc=$?"; tail -6 "$OUT/bench_h$h.txt"; done ;;
    ncu) timeout 200 ncu --clock-control none --set full -k "regex:SparseMla(Mma|Wgmma)" -c 2 \
          $B/bin/sparse_mla_bench --batches=${NCU_BATCH:-128} --reps=1 --kernels=mma --pool_mb=100 > "$OUT/ncu.txt" 2>&1
          echo "rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|L2 Hit|Bank" "$OUT/ncu.txt" | head -40 ;;
    ncu_stalls) for nb in ${NCU_BATCHES:-128 1}; do timeout 120 ncu --clock-control none -k "regex:SparseMla(Mma|Wgmma)" -c 1 \
          --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,smsp__inst_executed_pipe_tensor.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum \
          $B/bin/sparse_mla_bench --batches=$nb --reps=1 --kernels=mma --pool_mb=100 --mma_peak=false ${NCU_ARGS:-} \
          > "$OUT/ncu_stalls_b$nb.txt" 2>&1
          echo "rc=$? B=$nb"; grep -E "stalled|tensor|inst_executed" "$OUT/ncu_stalls_b$nb.txt" | awk '$NF+0 > 0.05 || /tensor|inst_executed.sum/' | head -30; done ;;
    sass_wide) cuobjdump -sass $B/bin/sparse_mla_bench | awk '/Function : .*WideKernelILi4E/ {on=1} /Function : / && !/WideKernelILi4E/ {on=0} on' \
          > "$OUT/sass_wide4.txt"; echo "wide<4> SASS lines: $(wc -l < "$OUT/sass_wide4.txt")"
          grep -oE "^ +/\*[0-9a-f]{4}\*/ +[@!A-Z0-9_.]+ *[A-Z0-9_.]+" "$OUT/sass_wide4.txt" | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -25 ;;
    sass8) cuobjdump -sass $B/bin/sparse_mla_bench | awk '/Function : .*SparseMlaMmaKernelILi4ELi32E/ {on=1} /Function : / && !/SparseMlaMmaKernelILi4ELi32E/ {on=0} on' \
          > "$OUT/sass8.txt"; echo "8-warp <4,32> SASS lines: $(wc -l < "$OUT/sass8.txt"), HMMA $(grep -c HMMA "$OUT/sass8.txt"), STL $(grep -c STL "$OUT/sass8.txt"), LDL $(grep -c LDL "$OUT/sass8.txt")"
          grep -n -E "STL|LDL|BAR.SYNC|HMMA|BRA" "$OUT/sass8.txt" | awk -F: '{print $1, $0}' | grep -E "STL|LDL|BRA" | cut -c1-110 | head -60 ;;
    ncu_dram) for h in 64 128; do timeout 100 ncu --clock-control none -k "regex:SparseMla(Mma|Wgmma)" -c 1 --metrics dram__bytes_read.sum,lts__t_bytes.sum,gpu__time_duration.sum \
          $B/bin/sparse_mla_bench --heads=$h --batches=${NCU_BATCH:-64} --reps=1 --kernels=mma --pool_mb=100 --mma_peak=false > "$OUT/ncu_dram_h$h.txt" 2>&1
          echo "rc=$? H=$h"; grep -E "dram__bytes|lts__t_bytes|duration" "$OUT/ncu_dram_h$h.txt"; done ;;
    bench_odd) for bin in sparse_mla_bench_base sparse_mla_bench; do timeout 150 $B/bin/$bin --kernels=mma --mma_peak=false --reps=${ODD_REPS:-50} \
          --heads=${ODD_HEADS:-64} --batches=${ODD_BATCHES:-1,3,8,16,24,32,40,48,64,80,96,112,128} > "$OUT/odd_h${ODD_HEADS:-64}_$bin.txt" 2>&1; echo "rc=$? $bin H=${ODD_HEADS:-64}"
          grep "^| [0-9]" "$OUT/odd_h${ODD_HEADS:-64}_$bin.txt" | cut -c1-80; done ;;
    smoke_ws) timeout ${SMOKE_TIMEOUT:-30} $B/bin/sparse_mla_test --gtest_color=no --gtest_filter='*_ws:*B128_H64_K128p512*:*Graph*:*Plan*' \
          > "$OUT/smoke_ws.txt" 2>&1; echo "rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED" "$OUT/smoke_ws.txt" | head -20 ;;
    sass_ws) cuobjdump -sass $B/bin/sparse_mla_bench | awk '/Function : .*WgmmaWs/ {on=1} /Function : / && !/WgmmaWs/ {on=0} on' \
          > "$OUT/sass_ws.txt"; echo "ws SASS lines: $(wc -l < "$OUT/sass_ws.txt"), STL $(grep -c STL "$OUT/sass_ws.txt"), LDL $(grep -c LDL "$OUT/sass_ws.txt")"
          grep -E "SETMAXREG|BAR\.|HGMMA|WARPGROUP" "$OUT/sass_ws.txt" | sed 's/^ *//' | cut -c1-90 | sort | uniq -c | sort -rn | head -20 ;;
    bench_cluster) A="--kernels=mma --mma_peak=false --reps=${CL_REPS:-50}"  # plan (cluster merge) vs the combine kernel
          for h in ${CL_HEADS:-64 16 128}; do for m in 0 -1; do
            timeout 90 $B/bin/sparse_mla_bench $A --heads=$h --cluster_merge=$m --batches=${CL_BATCHES:-1,2,3,4,8,16,24,32,40,48,64} \
              > "$OUT/cluster_h${h}_m$m.txt" 2>&1; echo "rc=$? H=$h cluster_merge=$m"; grep "^| [0-9]" "$OUT/cluster_h${h}_m$m.txt" | cut -c1-80
          done; done ;;
    memcheck_cluster) timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/sparse_mla_test \
          --gtest_filter='*_cluster*:*ClusterMerge*:*Graph*' > "$OUT/memcheck_cluster.txt" 2>&1; echo "rc=$?"; tail -4 "$OUT/memcheck_cluster.txt" ;;
    racecheck_cluster) timeout 180 compute-sanitizer --tool racecheck --error-exitcode 9 $B/bin/sparse_mla_test \
          --gtest_filter='*_cluster*:*ClusterMerge*' > "$OUT/racecheck_cluster.txt" 2>&1; echo "rc=$?"; tail -4 "$OUT/racecheck_cluster.txt" ;;
    bench_ws) R=${WS_REPS:-20}; A="--kernels=mma --mma_peak=false --reps=$R"
          timeout 60 $B/bin/sparse_mla_bench $A --batches=${WS_BATCHES:-1,3,16,32,48,64,96,128} > "$OUT/ws_plan.txt" 2>&1; echo "rc=$? plan"
          grep "^| [0-9]" "$OUT/ws_plan.txt" | cut -c1-90
          timeout 30 $B/bin/sparse_mla_bench $A --batches=${WS_OLD:-64,128} --wgmma_ws=-1 > "$OUT/ws_twowg.txt" 2>&1; echo "rc=$? two-warpgroup wgmma"
          grep "^| [0-9]" "$OUT/ws_twowg.txt" | cut -c1-90
          timeout 30 $B/bin/sparse_mla_bench $A --batches=${WS_OLD:-64,128} --wgmma=-1 > "$OUT/ws_mmasync.txt" 2>&1; echo "rc=$? mma.sync 8-warp"
          grep "^| [0-9]" "$OUT/ws_mmasync.txt" | cut -c1-90
          timeout 30 $B/bin/sparse_mla_bench $A --batches=16,32 --wgmma=1 > "$OUT/ws_forced.txt" 2>&1; echo "rc=$? ws forced"
          grep "^| [0-9]" "$OUT/ws_forced.txt" | cut -c1-90
          for h in 16 128; do timeout 40 $B/bin/sparse_mla_bench $A --heads=$h --batches=$([ $h = 16 ] && echo 1,32,128 || echo 32,64,128) > "$OUT/ws_h$h.txt" 2>&1
          echo "rc=$? H=$h"; grep "^| [0-9]" "$OUT/ws_h$h.txt" | cut -c1-90; done ;;
    memcheck_ws) timeout ${MC_TIMEOUT:-60} compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/sparse_mla_test \
          --gtest_filter='*_ws:*B5_H64_K128p512*_wgmma:*B4_H64_K5p7*_wgmma:*B1_H64*twowg:*B5_H64*twowg' > "$OUT/memcheck_ws.txt" 2>&1; echo "rc=$?"; tail -3 "$OUT/memcheck_ws.txt" ;;
    racecheck_ws) timeout ${RC_TIMEOUT:-60} compute-sanitizer --tool racecheck --error-exitcode 9 $B/bin/sparse_mla_test \
          --gtest_filter='*B7_H64*_ws:*B6_H64*_ws:*B4_H64_K5p7*_wgmma:*B2_H64*_len_holes*_ws' > "$OUT/racecheck_ws.txt" 2>&1; echo "rc=$?"; tail -3 "$OUT/racecheck_ws.txt" ;;
    sass) cuobjdump -sass $B/bin/sparse_mla_bench > "$OUT/sass_full.txt" 2>&1
          grep -oE "(HMMA|LDSM|LDGSTS|F2FP|HADD2|BAR|SHFL|MUFU)[.A-Z0-9_]*" "$OUT/sass_full.txt" | sort | uniq -c > "$OUT/sass_summary.txt"
          cat "$OUT/sass_summary.txt"; rm -f "$OUT/sass_full.txt" ;;
  esac
done
