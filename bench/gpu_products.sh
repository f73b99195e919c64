#!/usr/bin/env bash
# One GPU session for the warp-tile products (issue 10, part 1): the products against cuBLAS, the
# harness for every version of the linear ops at 12M (with the whole model) and at 120M, their
# kernel table, and the whole step beside PyTorch with both kinds of products. Writes to $OUT.
#   bash bench/gpu_products.sh [steps...]      steps: gemm check12 check120 kernels step (default all)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=python3
steps=${*:-gemm check12 check120 kernels step}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for s in $steps; do
  t0=$(date +%s)
  case $s in
    gemm) $py bench/gemm.py --json "$OUT/gemm.json" > "$OUT/gemm.md" 2>&1; echo "gemm exit $?"; cat "$OUT/gemm.md" ;;
    check12) $py -m andrea_numba.check --size 12M --seed 4 --json > "$OUT/check_12M.json" 2> "$OUT/check_12M.err"
             echo "check 12M exit $?"; tail -3 "$OUT/check_12M.err" ;;
    check120) $py -m andrea_numba.check --size 120M --seed 4 --op attn_qkv --op attn_out --op mlp --op loss \
                  --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --json > "$OUT/check_120M.json" 2> "$OUT/check_120M.err"
              echo "check 120M exit $?"; tail -3 "$OUT/check_120M.err" ;;
    kernels) mkdir -p "$OUT/kernels"
             for size in 12M 120M; do for op in attn_qkv attn_out mlp loss matmul "matmul a^T@b +="; do
               f="$OUT/kernels/${size}_${op//[^a-z_]/_}"
               $py bench/kernels.py "$op" --sizes $size --markdown "$f.md" > "$f.txt" 2>&1; echo "kernels $size $op exit $?"
               grep "^|" "$f.md" | grep -v "| v1 |"
             done; done ;;
    step) $py bench/step_time.py --sizes 12M 120M --products tf32x3 simt --json "$OUT/step.json" > "$OUT/step.txt" 2>&1
          echo "step exit $?"; cat "$OUT/step.txt" | grep -v '^{' ;;
  esac
  echo "[$s: $(( $(date +%s) - t0 )) s]"
done
[ -d "$OUT/kernels" ] && tar -C "$OUT" -czf "$OUT/kernels.tgz" kernels && rm -r "$OUT/kernels"
