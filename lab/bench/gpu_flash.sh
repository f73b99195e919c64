#!/usr/bin/env bash
# Flash attention on the GPU: the harness and the kernel times. Writes to $OUT.
#   bash lab/bench/gpu_flash.sh [steps...]      # PYTHONPATH set up as the README says
#   steps: flash (the default: the harness at 12M and 120M, flash beside the present attention,
#          then lab/bench/kernels.py's table of both at 12M); flash16 (flash v11 (bf16 products) and v12
#          (fp16): the harness at 12M and 120M, each output's largest error against the twin at its
#          precision and against the fp32 twin, and their kernel times beside v8 and v10 at both sizes)
WHAT=flash; source "$(dirname "$0")/gpu_lib.sh"      # OUT, py, disagree
steps=${*:-flash}

errors() {   # the largest rel_err of each (kernel, version, tensor) in a check's JSON file, over its blocks
  python3 -c "
import json, sys
rows = json.load(open(sys.argv[1]))['results']
worst = {}
for r in rows:
    k = (r['kernel'], r['version'], r['tensor'])
    worst[k] = max(worst.get(k, 0.0), r['rel_err'])
for (kernel, v, tensor), e in sorted(worst.items()):
    print(f'  {kernel} v{v} {tensor:<40} max rel_err {e:.2e}')" "$1"
}

nvidia-smi --query-gpu=name --format=csv,noheader
for s in $steps; do
  t0=$(date +%s)
  case $s in
    flash)
      $py -m lab.check --size 12M --seed 4 --op attn_flash --op attn --json > "$OUT/flash_check_12M.json" \
          2> "$OUT/flash_check_12M.err"; echo "check 12M exit $?"; tail -2 "$OUT/flash_check_12M.err"
      $py -m lab.check --size 120M --seed 4 --op attn_flash --json > "$OUT/flash_check_120M.json" \
          2> "$OUT/flash_check_120M.err"; echo "check 120M exit $?"; tail -2 "$OUT/flash_check_120M.err"
      for op in attn_flash attn; do
          $py lab/bench/kernels.py $op --sizes 12M --markdown "$OUT/bench_$op.md" > "$OUT/bench_$op.txt" 2>&1
          echo "bench $op exit $?"; cat "$OUT/bench_$op.txt"
      done ;;
    flash16)
      # The harness on v11 and v12 at both sizes (each compiling its kernels on 4 processes first), in
      # parallel: rows against the twin at the version's precision (OP_TOL, or LOW_PRECISION_TOL's
      # attn_flash entry when there is one) and against the fp32 twin; a row that disagrees is listed,
      # and every output's largest error, so that the tolerance can be set from these figures.
      mkdir -p "$OUT/flash16"
      for size in 12M 120M; do
        timeout 400 $py -m lab.check --size $size --seed 167 --compile-workers 4 --ops-only --op attn_flash \
            --version 11 --version 12 --json > "$OUT/flash16/check_$size.json" 2> "$OUT/flash16/check_$size.err" &
      done
      wait
      for size in 12M 120M; do
        echo "flash16 check $size: $(tail -1 "$OUT/flash16/check_$size.err")"; disagree "$OUT/flash16/check_$size.json"
        errors "$OUT/flash16/check_$size.json"
      done
      # GPU times of v11 and v12 beside v8 (forward) and v10 (the engine's backward), every block
      timeout 500 $py lab/bench/kernels.py attn_flash --sizes 12M,120M --version 8 --version 10 --version 11 --version 12 \
          --json "$OUT/flash16/kernels.json" --markdown "$OUT/flash16/kernels.md" > "$OUT/flash16/kernels.txt" 2>&1
      echo "kernels attn_flash exit $?"; grep "^|" "$OUT/flash16/kernels.md" ;;
  esac
  echo "[$s: $(( $(date +%s) - t0 )) s]"
done
[ -d "$OUT/flash16" ] && tar -C "$OUT" -czf "$OUT/flash16.tgz" flash16
true
