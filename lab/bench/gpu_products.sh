#!/usr/bin/env bash
# The warp-tile products on the GPU: the products against cuBLAS, the
# harness for every version of the linear ops at 12M (with the whole model) and at 120M, their
# kernel table, and the whole step beside PyTorch with both kinds of products. Writes to $OUT.
#   bash lab/bench/gpu_products.sh [steps...]      steps: gemm check12 check120 kernels step (default all)
#   and for the split tiles (matmul v5, the linear ops' v4): gemm5 check5 step5 profile5
#   and for the k-major tiles (matmul v6, the linear ops' v5, the engine's): gemm6 check6 model step6
WHAT=products; source "$(dirname "$0")/gpu_lib.sh"      # OUT, py, disagree, check_model
steps=${*:-gemm check12 check120 kernels step}

check_versions() {   # check_versions TAG SEED --version N ...: the linear ops and products at 12M and 120M
  local tag=$1 seed=$2; shift 2
  for size in 12M 120M; do
    $py -m lab.check --size $size --seed $seed --op attn_qkv --op attn_out --op mlp --op loss --op matmul \
        --op "matmul a@b^T" --op "matmul a^T@b +=" "$@" --json > "$OUT/${tag}_$size.json" 2> "$OUT/${tag}_$size.err"
    echo "$tag $size exit $?"; tail -1 "$OUT/${tag}_$size.err"; disagree "$OUT/${tag}_$size.json"
  done
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for s in $steps; do
  t0=$(date +%s)
  case $s in
    gemm) $py lab/bench/gemm.py --json "$OUT/gemm.json" > "$OUT/gemm.md" 2>&1; echo "gemm exit $?"; cat "$OUT/gemm.md" ;;
    check12) $py -m lab.check --size 12M --seed 4 --json > "$OUT/check_12M.json" 2> "$OUT/check_12M.err"
             echo "check 12M exit $?"; tail -3 "$OUT/check_12M.err" ;;
    check120) $py -m lab.check --size 120M --seed 4 --op attn_qkv --op attn_out --op mlp --op loss \
                  --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --json > "$OUT/check_120M.json" 2> "$OUT/check_120M.err"
              echo "check 120M exit $?"; tail -3 "$OUT/check_120M.err" ;;
    kernels) mkdir -p "$OUT/kernels"
             for size in 12M 120M; do for op in attn_qkv attn_out mlp loss matmul "matmul a^T@b +="; do
               f="$OUT/kernels/${size}_${op//[^a-z_]/_}"
               $py lab/bench/kernels.py "$op" --sizes $size --markdown "$f.md" > "$f.txt" 2>&1; echo "kernels $size $op exit $?"
               grep "^|" "$f.md" | grep -v "| v1 |"
             done; done ;;
    step) $py lab/bench/step_time.py --sizes 12M 120M --recipe tf32x3 simt --json "$OUT/step.json" > "$OUT/step.txt" 2>&1
          echo "step exit $?"; cat "$OUT/step.txt" | grep -v '^{' ;;
    gemm5) $py lab/bench/gemm.py --versions 4,5 --blocks --json "$OUT/gemm5.json" > "$OUT/gemm5.md" 2>&1
           echo "gemm5 exit $?"; cat "$OUT/gemm5.md" ;;
    check5) check_versions check5 6 --version 4 --version 5 ;;
    gemm6) $py lab/bench/gemm.py --versions 6 --blocks --json "$OUT/gemm6.json" > "$OUT/gemm6.md" 2>&1
           echo "gemm6 exit $?"; cat "$OUT/gemm6.md" | grep -v "v6_regs" ; grep -o "'v6_regs': \[[0-9]*\]" "$OUT/gemm6.md" | sort | uniq -c ;;
    check6) check_versions check6 7 --version 5 --version 6 ;;
    model) check_model 8 ;;
    step6) $py lab/bench/step_time.py --sizes 12M 120M --recipe tf32x3k tf32x3 --json "$OUT/step6.json" > "$OUT/step6.txt" 2>&1
           echo "step6 exit $?"; grep -v '^{' "$OUT/step6.txt" ;;
    step5) $py lab/bench/step_time.py --sizes 12M 120M --recipe tf32x3 tf32x3s --json "$OUT/step5.json" > "$OUT/step5.txt" 2>&1
           echo "step5 exit $?"; grep -v '^{' "$OUT/step5.txt" ;;
    profile5) for size in 12M 120M; do
                $py lab/bench/profile_step.py --size $size --recipe tf32x3s --json "$OUT/profile5_$size.json" > "$OUT/profile5_$size.txt" 2>&1
                echo "profile5 $size exit $?"; head -12 "$OUT/profile5_$size.txt"
              done ;;
  esac
  echo "[$s: $(( $(date +%s) - t0 )) s]"
done
[ -d "$OUT/kernels" ] && tar -C "$OUT" -czf "$OUT/kernels.tgz" kernels && rm -r "$OUT/kernels"
