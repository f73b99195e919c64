#!/usr/bin/env bash
# A short GPU session for flash attention: the harness at 12M and 120M (flash beside the present
# attention), then bench/kernels.py's table of both at 12M. Writes to $OUT.
#   bash bench/gpu_flash.sh            # PYTHONPATH set up as the README says
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=python3
nvidia-smi --query-gpu=name --format=csv,noheader
$py -m andrea_numba.check --size 12M --seed 4 --op attn_flash --op attn --json > "$OUT/flash_check_12M.json" \
    2> "$OUT/flash_check_12M.err"; echo "check 12M exit $?"; tail -2 "$OUT/flash_check_12M.err"
$py -m andrea_numba.check --size 120M --seed 4 --op attn_flash --json > "$OUT/flash_check_120M.json" \
    2> "$OUT/flash_check_120M.err"; echo "check 120M exit $?"; tail -2 "$OUT/flash_check_120M.err"
for op in attn_flash attn; do
    $py bench/kernels.py $op --sizes 12M --markdown "$OUT/bench_$op.md" > "$OUT/bench_$op.txt" 2>&1
    echo "bench $op exit $?"; cat "$OUT/bench_$op.txt"
done
