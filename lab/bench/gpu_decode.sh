#!/usr/bin/env bash
# The sampler's decoder and a run's start on the GPU: the decoder's bf16 rounding against the table, the draws and the decoders (fp32, bf16) against their twins,
# a bf16 run's sampler (the bf16 decoder beside the bf16 whole forward: time and the same tokens),
# the step's rungs (the engine against rung 5's 128-bit loads, rung 6's and 7's shuffles, rung 9's trees), a bf16 run's start with the kernel
# cache empty and full, the fp32 decoder's paths, one product taken apart (timed, then each variant
# once under Nsight Compute: its stalls), the step kernel by kernel and the fp32 start. Each step writes its files to $OUT as it ends, so a run cut short keeps them.
#   bash lab/bench/gpu_decode.sh [steps...]   steps: rungs tests bf16 kernels parts fp32 rounding start start32 ncu
#                                             startprof (a second start, cache full, under cProfile and -X importtime)
#                                             old (the step of an earlier tree unpacked in $OLD, default old_engine/)
#                                             ncustep (one step of rungs $RUNGS, default 1,9, under Nsight Compute;
#                                             rungs and kernels: $RUNGS default 1,9,5,8)
#                                             (default all, in that order)
#   PACK=FILE.tgz: after each step every file of $OUT also packed into FILE (one file to bring back
#   from a machine that returns few; a run cut short keeps the steps done)
WHAT=decode; source "$(dirname "$0")/gpu_lib.sh"      # OUT, tmp, py
steps=${*:-rungs tests bf16 kernels parts fp32 rounding start start32 ncu ncustep}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
for s in $steps; do
  t0=$(date +%s)
  case $s in
    rounding) timeout 90 $py -m pytest -q -p no:cacheprovider tests/test_rounding.py > "$OUT/test_rounding.txt" 2>&1
              echo "test_rounding exit $?"; tail -2 "$OUT/test_rounding.txt" ;;
    tests) timeout 200 $py -m pytest -q -p no:cacheprovider tests/test_decode_draw.py tests/test_decode_gpu.py \
               > "$OUT/test_decode.txt" 2>&1
           echo "test_decode_draw, test_decode_gpu exit $?"; tail -2 "$OUT/test_decode.txt" ;;
    bf16) timeout 150 $py lab/bench/decode_speed.py --precision bf16 --no-blocks --runs 3 \
              --json "$OUT/decode_12M_bf16.json" > "$OUT/decode_12M_bf16.txt" 2>&1
          echo "decode_speed bf16 exit $?"; tail -12 "$OUT/decode_12M_bf16.txt" ;;
    rungs) timeout 200 $py lab/bench/decode_speed.py --versions ${RUNGS:-1,9,5,8} --runs 5 --json "$OUT/decode_rungs.json" \
               > "$OUT/decode_rungs.txt" 2>&1
           echo "decode_speed --versions exit $?"; tail -6 "$OUT/decode_rungs.txt" ;;
    start) timeout 200 $py lab/bench/start_time.py --size 12M --repeats 1 --out "$OUT/start_12M.json" \
               > "$OUT/start_12M.txt" 2>&1
           echo "start_time exit $?"; tail -6 "$OUT/start_12M.txt" ;;
    fp32) timeout 150 $py lab/bench/decode_speed.py --no-blocks --runs 3 --json "$OUT/decode_12M.json" \
              > "$OUT/decode_12M.txt" 2>&1
          echo "decode_speed exit $?"; tail -12 "$OUT/decode_12M.txt" ;;
    parts) timeout 150 $py lab/bench/decode_parts.py --json "$OUT/decode_parts.json" > "$OUT/decode_parts.txt" 2>&1
           echo "decode_parts exit $?"; cat "$OUT/decode_parts.txt" ;;
    ncu) timeout 200 ncu --cache-control none --clock-control none --section SpeedOfLight --section WarpStateStats \
             --section Occupancy --section LaunchStats $py lab/bench/decode_parts.py --once > "$OUT/ncu_parts.txt" 2>&1
         echo "ncu decode_parts exit $?"
         $py lab/bench/ncu_text.py "$OUT/ncu_parts.txt" | tee "$OUT/ncu_parts_table.txt" | cut -c1-200 ;;
    ncustep) timeout 240 ncu --profile-from-start off --cache-control none --clock-control none --section SpeedOfLight \
                 --section WarpStateStats --section Occupancy --section LaunchStats \
                 $py lab/bench/decode_speed.py --kernels --once --versions ${RUNGS:-1,9} > "$OUT/ncu_step.txt" 2>&1
             echo "ncu decode step exit $?"
             $py lab/bench/ncu_text.py "$OUT/ncu_step.txt" | tee "$OUT/ncu_step_table.txt" | cut -c1-200 ;;
    kernels) timeout 200 $py lab/bench/decode_speed.py --kernels --versions ${RUNGS:-1,9,5,8} --json "$OUT/decode_kernels.json" \
                 > "$OUT/decode_kernels.txt" 2>&1
             echo "decode_speed --kernels exit $?"; tail -24 "$OUT/decode_kernels.txt" ;;
    start32) timeout 200 $py lab/bench/start_time.py --size 12M --repeats 1 --precision fp32 \
                 --out "$OUT/start_12M_fp32.json" > "$OUT/start_12M_fp32.txt" 2>&1
             echo "start_time fp32 exit $?"; tail -6 "$OUT/start_12M_fp32.txt" ;;
    startprof) export ANDREA_KERNEL_CACHE="$tmp/startprof_cache"   # a start with its cache full, under cProfile
               timeout 200 $py -m andrea_numba.train --size 12M --steps 1 --out "$tmp/startprof_1" > /dev/null 2>&1
               timeout 120 $py -X importtime -m cProfile -s cumtime -m andrea_numba.train --size 12M --steps 1 \
                   --out "$tmp/startprof_2" > "$tmp/startprof.txt" 2> "$OUT/start_imports.txt"
               echo "start under cProfile exit $?"; grep -m1 "first step done" "$tmp/startprof.txt"
               grep -A70 "Ordered by" "$tmp/startprof.txt" | cut -c1-160 > "$OUT/start_profile.txt"
               sort -t'|' -k2 -n "$OUT/start_imports.txt" | tail -30 > "$OUT/start_imports_top.txt"
               rm -f "$OUT/start_imports.txt"; unset ANDREA_KERNEL_CACHE ;;
    old) if [ -d "${OLD:-old_engine}" ]; then       # an earlier tree beside this one, on the same machine
             out=$(cd "$OUT" && pwd)
             (cd "${OLD:-old_engine}" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout 90 $py lab/bench/decode_speed.py \
                  --versions 1 --runs 3 > "$out/old_rung1.txt" 2>&1
              PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout 90 $py lab/bench/decode_speed.py --kernels \
                  > "$out/old_kernels.txt" 2>&1)
             echo "the earlier tree's decoder:"; tail -3 "$OUT/old_rung1.txt"
         else echo "old: no ${OLD:-old_engine}/ (git archive REV andrea_numba reference lab configs pyproject.toml | tar -x -C it)"; fi ;;
    *) echo "unknown step $s (rounding tests bf16 rungs start fp32 parts ncu ncustep kernels start32 startprof old)"; exit 2 ;;
  esac
  echo "[$s: $(( $(date +%s) - t0 )) s]"
  if [ -n "${PACK:-}" ]; then tar czf "$PACK.part" -C "$OUT" . && mv "$PACK.part" "$PACK"; fi
done
true
