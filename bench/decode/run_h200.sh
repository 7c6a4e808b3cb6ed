#!/usr/bin/env bash
# The recorded runs of issue 18 (bench/RESULTS.md, "Full-size decode") on the H200, from the repo root there:
#   here:  /work/shared/gpu/bundle.sh .gpu/decode-bench build-h200/bench/decode/dsv4-decode-bench
#          cp bench/decode/run_h200.sh .gpu/decode-bench/      (carry [".gpu/decode-bench"])
#   there: bash .gpu/decode-bench/run_h200.sh $OUT [RUNS]    RUNS: any of a b c d ncu (default: a b c d, ~4 minutes)
# Only a few files come back from $OUT, so everything goes into $OUT/decode-bench.tgz.
set -u
B=$(cd "$(dirname "$0")" && pwd); OUT=${1:?usage: run_h200.sh OUT_DIR [RUNS]}; RUNS=${2:-"a b c d"}
export LD_LIBRARY_PATH=$B/lib; X=$B/bin/dsv4-decode-bench; W=$(mktemp -d)
C="--simulate-rank=0 --simulate-world=4 --comm-busbw-gbs=146 --comm-latency-us=20"
r() { local n=$1 t=$2; shift 2; timeout "$t" "$X" "$@" --json="$W/$n.json" > "$W/$n.log" 2>&1; echo "$n rc=$? $(date +%T)" | tee -a "$W/rc.txt"; }
for run in $RUNS; do
  case $run in
    a) r a_nvfp4 120 --layers=fit --experts=nvfp4 --svg="$W/a_nvfp4.svg"
       r a_mxfp4 120 --layers=fit --experts=mxfp4 ;;
    b) r b_tp4 60 $C --context=8192 --svg="$W/b_tp4.svg"
       r b_tp4_256 60 $C --context=8192 --batches=256
       r b_tp4_skew 60 $C --context=8192 --batches=1,64 --routing=skewed ;;
    c) r c_eager 60 $C --context=8192 --batches=1,64 --cuda-graphs=false
       r c_simt 60 $C --context=8192 --batches=1,64 --attention-kernel=simt ;;
    d) r d_tp4_32k 60 $C --context=8192,32768 --batches=1,64 ;;
    ncu) timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum -k 'regex:^(?!.*(Repack|Fill|Probe))' \
           --launch-count 200 --csv "$X" $C --layers=4 --batches=64 --context=8192 --cuda-graphs=false --warmup=0 \
           --reps=1 --phase_reps=1 > "$W/ncu.csv" 2> "$W/ncu.err"; echo "ncu rc=$?" | tee -a "$W/rc.txt" ;;
    *) echo "unknown run '$run' (a b c d ncu)" >&2 ;;
  esac
done
(cd "$W" && tar czf "$OUT/decode-bench.tgz" ./*)
