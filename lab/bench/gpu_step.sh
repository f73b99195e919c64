#!/usr/bin/env bash
# The training step on the GPU: flash attention v2 checked (12M, 120M) and timed, the CUDA
# graph against eager (lab/bench/gpu_graph.py), the whole step beside PyTorch, and the default 12M
# training run with its wall time. Writes to $OUT.
#   bash lab/bench/gpu_step.sh [steps...]      steps: tf32 flash graph step mem120 train (default all)
#   mem120: ten steps of the 120M config (graph mode), for the memory plan against what setup took
WHAT=step; source "$(dirname "$0")/gpu_lib.sh"      # OUT, tmp, py
steps=${*:-tf32 flash graph step mem120 train}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
for s in $steps; do
  t0=$(date +%s)
  case $s in
    tf32) $py lab/bench/tf32_check.py 2>&1 | tee "$OUT/tf32_check.txt" ;;
    flash) for size in 12M 120M; do
             $py -m lab.check --size $size --seed 5 --op attn_flash --json > "$OUT/flash_check_$size.json" \
                 2> "$OUT/flash_check_$size.err"; echo "check $size attn_flash exit $?"; tail -2 "$OUT/flash_check_$size.err"
           done
           $py lab/bench/kernels.py attn_flash --sizes 12M,120M --markdown "$OUT/flash_kernels.md" > "$OUT/flash_kernels.txt" 2>&1
           echo "kernels attn_flash exit $?"; grep "^|" "$OUT/flash_kernels.md" ;;
    graph) $py lab/bench/gpu_graph.py --out "$OUT/graph" --sizes 12M --steps 20 > "$OUT/graph.txt" 2>&1
           echo "gpu_graph exit $?"; tail -25 "$OUT/graph.txt" ;;
    step) $py lab/bench/step_time.py --sizes 12M 120M --attention both --json "$OUT/step.json" > "$OUT/step.txt" 2>&1
          echo "step exit $?"; grep -v '^{' "$OUT/step.txt" ;;
    mem120) rm -rf $tmp/run120M
           $py -m andrea_numba.train --size 120M --steps 10 --out $tmp/run120M --log-every 5 > "$OUT/train120M.txt" 2>&1
           echo "train 120M exit $?"; grep -E "memory|launches|tok/s|total" "$OUT/train120M.txt" ;;
    train) rm -rf $tmp/run12M
           /usr/bin/time -v $py -m andrea_numba.train --size 12M --out $tmp/run12M --log-every 500 > "$OUT/train.txt" 2> "$OUT/train.time"
           echo "train exit $?"; tail -15 "$OUT/train.txt"; grep -E "Elapsed|Maximum resident" "$OUT/train.time"
           mkdir -p "$OUT/run12M"; cp $tmp/run12M/*.json $tmp/run12M/*.png "$OUT/run12M/" 2>/dev/null
           cp $tmp/run12M/.*.json "$OUT/run12M/" 2>/dev/null; ls -la $tmp/run12M ;;
  esac
  echo "[$s: $(( $(date +%s) - t0 )) s]"
done
for d in graph run12M; do [ -d "$OUT/$d" ] && tar -C "$OUT" -czf "$OUT/$d.tgz" "$d" && rm -r "$OUT/$d"; done
true
