#!/usr/bin/env bash
# GPU jobs: where the step's GPU time goes, kernel by kernel (Nsight Compute), the training step in
# graph mode against eager, the whole step beside PyTorch, harness runs, each kernel version and
# products kind checked and timed. Writes to $OUT (lab/bench/gpu_lib.sh: by default
# results/DATE-GPU-STEPS, the steps joined by +), a job's files in a folder named after it.
#   bash lab/bench/gpu_profile.sh [steps...]
#   steps: profile (12M and 120M kernels by op), graph (12M, 20 steps, both modes), step (12M and
#          120M beside PyTorch), check120 (linear ops v5 and matmul v6 at 120M), ln (layernorm and
#          residual_layernorm, every version, at 12M), checks (the harness on linear ops v5, matmul v6,
#          LayerNorm and flash v3/v4, and the whole model), gemm (matmul v6 beside cuBLAS), flash (flash attention v3 and v4 timed),
#          mlp6 (the MLP's v6 against v5: harness, kernel table, the step), model (the whole model
#          against the twin at 12M and 120M), v8 (matmul v8 and v7 and the linear ops on them: harness
#          at 12M, the whole model, products beside cuBLAS, the step with products fp32 and tf32x3t),
#          mlp9 (the MLP's v9 against v8: harness at 12M and 120M, kernel table, the step), flash5
#          (flash attention v5 and v6 against v3: the same three), simt2 (matmul v9 and the linear
#          ops on it: the whole model, products beside v3 and cuBLAS, the step, the harness),
#          trainstep (one whole 12M training step, kernel by kernel, against its graph replay),
#          embed3 (the harness on every embed version at 12M), embed4 (embed_bwd v4 against v2 and v3:
#          the harness at 12M and 120M, lab/bench/kernels.py's table on text-like token ids);
#          adamw3 (AdamW v3 against v2: the harness at 12M and 120M, lab/bench/kernels.py's table),
#          ln2 (residual_layernorm v2/v3 against v1/v2: the harness at 12M and 120M, the kernel table),
#          torchstep (lab/bench/step_time.py at 12M and 120M, or TORCH_SIZES, with PyTorch fp32's whole training step);
#          flash8 (flash attention v7 and v8 against v5: the harness at 12M and 120M, kernel table, the step);
#          flash9-mlp12 (flash v9, mlp v11/v12, loss_fwd v9: same bits, harness and kernel tables at 12M, the whole model);
#          flash10 (flash v10 against v9's bits; the harness on v10 at 12M, and on it and flash9-mlp12's versions at 120M);
#          ahead (lab/bench/compile_ahead_check.py at AHEAD_SIZE, default 12M); default (the default 12M run,
#          timed, its run files and loss plot); flash10-mlp12-120M (the harness at 120M on mlp v11/v12, loss_fwd
#          v9, flash v9/v10, and the whole model at 12M, in parallel); bf16 (matmul v10 against v8: the harness at
#          12M and 120M, the products beside cuBLAS SGEMM and PyTorch's bf16 matmul); bf16b (the linear
#          ops' bf16 versions at 12M, the whole model at bf16 at 12M and 120M); bf16c (the same at 120M with
#          the tolerances that bf16b's figures set, and the step with bf16 products beside PyTorch bf16);
#          quality (12M trained in fp32, bf16 and fp16, validation losses together: QUALITY_STEPS, 2000);
#          mm12 (matmul v12, bf16 tiles read by ldmatrix: the harness at 12M and 120M, the products of
#          v8, v10 and v12 beside cuBLAS SGEMM and PyTorch bf16, and v12 at each of its tiles);
#          mm13 (matmul v13, cp.async ring on bf16 copies: the harness at 12M and 120M, v12 and v13 side by
#          side, v13 at each of its tiles);
#          cublas (the products through cuBLASLt: harness, whole model, gemm and step tables, graph = eager);
#          bf16d (started in the background: the 16-bit versions' harness at 120M, the fp16 model with the loss
#          scaled; bf16d_report waits and reports); resume16 (bit-exact resume in bf16 and fp16);
#          bf16l-cublas16 (matmul v12, cuBLASLt's bf16/fp16 route, flash v11/v12, the linear ops on v12's tiles:
#          harness, models, the gemm, step and flash tables); bf16l-f16w (the bf16l/fp16 models, quality and
#          resume); quality-floor (the quality question at 2,000 steps with an fp32/cublas noise floor, the
#          120M model at bf16 and fp16, flash attention's kernels; FLOOR_PRECISIONS sets the runs,
#          FLOOR_FLASH=0 leaves out the flash table);
#          bf16r (products bf16r: harness, whole model, the step beside bf16-ampere and PyTorch, the 120M profile, v15's tiles);
#          bf16m (matmul v17 and products bf16m, embed_bwd v5, residual_layernorm_fwd v3: probe, harness, model, resume, step, tables);
#          bf16m-flash13 (products bf16m and flash v13: harness, model, resume; the step, flash and v17 tables);
#          fp8-probe (which cuBLASLt FP8 forms run, with the library's log); fp8-step (FP8 at 120M, the models at
#          12M, the step by scope beside PyTorch, fp8-e5m2 resume); fp8-quality (12M 2000 steps: fp32, bf16, 3 FP8 scopes);
#          fp8-checks (the FP8 kernels against the twin at 12M, the fp8-e5m2 model, FP8 products against bf16, a training smoke run);
#          mm23 (matmul v23, v19 with its in-kernel split-K sums' loads batched: products beside v18 and v19, bits, the step);
#          bf16-hopper-loss18 (bf16-hopper with loss v18/v16 (the logits kept, M and se saved): bits against bf16s, models, steps x30, bf16 resume, profile);
#          bf16-hopper (products bf16-hopper: flash v14 and LN bwd v6 writing the products' operands in bf16: bits against bf16s, model, steps, profile);
#          bf16s (products bf16s against bf16t, mlp v20 against v19: models, bits, steps, profile);
#          ln5-step (residual_layernorm_bwd v5: the whole models, the step x20);
#          mm18-tiles-ln5 (v18's two-blocks tile: bits, products, operand layouts; residual_layernorm v5: harness, table);
#          bf16t (products bf16t: harness, models at 12M/120M, step x20, bf16 resume, profile);
#          mm18-stores (v18 with paired stores, tiles along the shorter side: bits, products, step, profile, ncu);
#          mm18 (matmul v18 and products bf16t: v18's bits against v17, harness, model, products, step);
#          bf16m-profile (the harness on bf16m's versions, embed v5, LN v3; the bf16m model; flash tables; profile);
#          profile-bf16l-cublas (the 120M bf16 step kernel by kernel with our products and with cuBLASLt's);
#          bf16-ampere (the wgmma probe; v13's linear ops and the bf16-ampere model: harness, resume, step, profile, gemm, torch.compile);
#          cublas-bf16-step (the step with cuBLASLt bf16 products on k_round_bf16's copies, then mm14);
#          mm14 (matmul v14, wgmma on K-major bf16 copies: the harness at 12M and 120M at once, v13, v14, v21 timed);
#          mm15 (matmul v15, wgmma in flight on a dynamic-shared-memory ring: the harness at 12M and 120M, v14, v15, v21 timed);
#          GRAPH_STEPS=n sets graph's steps (20)
WHAT=$(echo ${*:-profile graph step check120 ln} | tr ' ' +)
source "$(dirname "$0")/gpu_lib.sh"      # OUT, tmp, py, disagree, check_model, check_op_sizes, compare_versions
steps=${*:-profile graph step check120 ln}

resume_bf16() {   # resume_bf16 DIR [PRECISION]: bit-exact resume in bf16 (the engine's products) or PRECISION, 12M: run a (60
  # steps straight) against run b (SIGTERM after 30 logged steps, then --resume): the same losses and checkpoint bytes, into DIR/resume.json
  local d=$1 prec=${2:-bf16} p=$tmp/r16b args="--size 12M --microbatches 1 --steps 60 --log-every 20 --compile-workers 4" pid waited
  rm -rf $p
  timeout 100 $py -m andrea_numba.train $args --precision $prec --out $p/a > "$d/resume_a.log" 2>&1; echo "$prec a exit $?"
  $py -m andrea_numba.train $args --precision $prec --out $p/b > "$d/resume_b1.log" 2>&1 &
  pid=$!; waited=0
  until [ -f $p/b/.loss.json ] && [ "$(wc -l < $p/b/.loss.json)" -ge 30 ]; do
    sleep 0.1; waited=$((waited + 1)); if [ $waited -ge 1000 ] || ! kill -0 $pid 2>/dev/null; then break; fi
  done
  kill -TERM $pid; wait $pid; echo "$prec b (SIGTERM) exit $?"
  timeout 100 $py -m andrea_numba.train --resume $p/b > "$d/resume_b2.log" 2>&1; echo "$prec b (resume) exit $?"
  $py - "$p" > "$d/resume.json" <<'PY'
import hashlib, json, sys
from pathlib import Path
from andrea_numba.runlog import read_loss
p = Path(sys.argv[1])
key = lambda d: [(r["step"], r["train_loss"], r.get("val_loss"), r["lr"], r["grad_norm"]) for r in read_loss(d)]
sha = lambda f: hashlib.sha256(f.read_bytes()).hexdigest()
a, b = key(p / "a"), key(p / "b")
print(json.dumps({"steps_a": len(a), "steps_b": len(b), "loss_json_identical": a == b, "last": a[-1:],
              "checkpoints_identical": sha(p / "a" / "checkpoint.bin") == sha(p / "b" / "checkpoint.bin")}))
PY
  cat "$d/resume.json"; grep -h "precision\|stopped by signal\|resumed from" "$d"/resume_*.log | head -5
}

same_bits_then_time() {   # same_bits_then_time TAG BASE NEW CHECK_SIZE SEED ITERS [resume], into $OUT/TAG: products
  # NEW against BASE bit for bit (lab/bench/model_bits.py, a whole 120M and 12M step; stops at a difference, status
  # 1), the whole NEW model against the twin at CHECK_SIZE (meanwhile), the step of both (ITERS iterations),
  # with "resume" bit-exact resume in bf16 (resume_bf16), then the 120M NEW step kernel by kernel
  local tag=$1 base=$2 new=$3 size=$4 seed=$5 iters=$6 d="$OUT/$1" rc=0 at
  mkdir -p "$d"
  timeout 200 $py -m lab.check --size $size --seed $seed --compile-workers 2 --model-only --recipe $new \
      --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
  for at in 120M 12M; do
    timeout 150 $py lab/bench/model_bits.py --sizes $at --same $base $new --json "$d/bits_$at.json" \
        > "$d/bits_$at.txt" 2>&1; rc=$?; echo "model_bits $at exit $rc: $(tail -1 "$d/bits_$at.txt")"
    if [ $rc -ne 0 ]; then tail -5 "$d/bits_$at.txt"; break; fi
  done
  wait
  echo "model_$size.json: $(tail -1 "$d/model_$size.err")"; disagree "$d/model_$size.json"
  if [ $rc -ne 0 ]; then echo "$tag: $new does not give $base's bits here: stopping"; return 1; fi
  timeout 200 $py lab/bench/step_time.py --sizes 120M 12M --recipe $new $base --iters $iters \
      --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
  if [ "${7:-}" = resume ]; then resume_bf16 "$d"; fi
  OUT=$d profile_kernels kernels_120M_$new 40 --size 120M --recipe $new
}

profile_kernels() {   # profile_kernels TAG LINES RUN_ARGS...: lab/bench/profile_kernels.py run RUN_ARGS under Nsight
  # Compute, then its table into $OUT/TAG.md and .json (the first LINES lines shown)
  local tag=$1 lines=$2; shift 2
  timeout 240 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --clock-control none \
      $py lab/bench/profile_kernels.py run "$@" --log "$tmp/launches_$tag.json" > "$tmp/ncu_$tag.csv" 2> "$tmp/ncu_$tag.err"
  echo "ncu $tag exit $?"; grep -v "^==PROF==" "$tmp/ncu_$tag.err" | tail -3
  $py lab/bench/profile_kernels.py table --log "$tmp/launches_$tag.json" --ncu "$tmp/ncu_$tag.csv" \
      --markdown "$OUT/$tag.md" --json "$OUT/$tag.json" > /dev/null
  echo "table $tag exit $?"; head -"$lines" "$OUT/$tag.md"
}

product_version() {   # product_version V GEMM_VERSIONS: matmul vV on the three product cases in the harness at 12M
  # and 120M at once (--compile-workers 2), then lab/bench/gemm.py's table of GEMM_VERSIONS; into $OUT/mmV/
  local v=$1 versions=$2 size d="$OUT/mm$1"; declare -A pid
  mkdir -p "$d"
  for size in 12M 120M; do
    timeout 150 $py -m lab.check --size $size --seed 211 --ops-only --op matmul --op "matmul a@b^T" \
        --op "matmul a^T@b +=" --version "$v" --compile-workers 2 --json > "$d/check_$size.json" 2> "$d/check_$size.err" &
    pid[$size]=$!
  done
  for size in 12M 120M; do       # waits for these two only (not for a step left in the background)
    wait "${pid[$size]}"; echo "mm$v check $size exit $?: $(tail -1 "$d/check_$size.err")"
    disagree "$d/check_$size.json"
  done
  timeout 100 $py lab/bench/gemm.py --versions "$versions" --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
  echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -3 "$d/gemm.err"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/gpu.txt"
for s in $steps; do
  t0=$(date +%s)
  case $s in
    profile) for size in 12M 120M; do profile_kernels "kernels_$size" 30 --size $size; done ;;
    embed3) timeout 90 $py -m lab.check --size 12M --seed 53 --op embed --ops-only --json \
                > "$OUT/embed3_check_12M.json" 2> "$OUT/embed3_check_12M.err"
            echo "embed3 check 12M exit $?"; tail -1 "$OUT/embed3_check_12M.err"; disagree "$OUT/embed3_check_12M.json" ;;
    embed4) check_op_sizes "$OUT/embed4" embed 59
            timeout 150 $py lab/bench/kernels.py embed --sizes 12M,120M --markdown "$OUT/embed4/kernels.md" \
                > "$OUT/embed4/kernels.txt" 2>&1; echo "kernels embed exit $?"; grep "^|" "$OUT/embed4/kernels.md" ;;
    adamw3) check_op_sizes "$OUT/adamw3" adamw_zero 61
            timeout 120 $py lab/bench/kernels.py adamw_zero --sizes 12M,120M --markdown "$OUT/adamw3/kernels.md" \
                > "$OUT/adamw3/kernels.txt" 2>&1; echo "kernels adamw_zero exit $?"; grep "^|" "$OUT/adamw3/kernels.md" ;;
    trainstep) profile_kernels trainstep_12M 40 --size 12M --train-step $tmp/trainstep ;;
    ln2) check_op_sizes "$OUT/ln2" residual_layernorm 67
         timeout 150 $py lab/bench/kernels.py residual_layernorm --sizes 12M,120M --markdown "$OUT/ln2/kernels.md" \
             > "$OUT/ln2/kernels.txt" 2>&1; echo "kernels residual_layernorm exit $?"; grep "^|" "$OUT/ln2/kernels.md" ;;
    torchstep) timeout 200 $py lab/bench/step_time.py --sizes ${TORCH_SIZES:-12M 120M} --torch-train-step --json "$OUT/torchstep.json" \
                   > "$OUT/torchstep.txt" 2>&1
               echo "step_time exit $?"; grep -v '^{' "$OUT/torchstep.txt" ;;
    graph) timeout 300 $py lab/bench/gpu_graph.py --out "$OUT/graph" --sizes 12M --steps "${GRAPH_STEPS:-20}" --dropout 0 > "$OUT/graph.txt" 2>&1
           echo "gpu_graph exit $?"; tail -12 "$OUT/graph.txt" ;;
    step) timeout 200 $py lab/bench/step_time.py --sizes 12M 120M --flash-version 3 4 --json "$OUT/step.json" > "$OUT/step.txt" 2>&1
          echo "step exit $?"; grep -v '^{' "$OUT/step.txt" ;;
    check120) timeout 400 $py -m lab.check --size 120M --seed 7 --op attn_qkv --op attn_out --op mlp --op loss \
                  --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --version 5 --version 6 --ops-only --json \
                  > "$OUT/check6_120M.json" 2> "$OUT/check6_120M.err"
              echo "check6 120M exit $?"; tail -1 "$OUT/check6_120M.err"; disagree "$OUT/check6_120M.json" ;;
    checks) # the split-K choice (linear ops v5, matmul v6), the LayerNorm versions and flash v3/v4 at 12M;
            # 120M: flash v4 and the MLP's products; then the whole model at both sizes
            run_check() { local tag=$1 size=$2 t=$3; shift 3
              timeout $t $py -m lab.check --size $size --seed 11 --ops-only "$@" --json > "$OUT/$tag.json" 2> "$OUT/$tag.err"
              echo "$tag exit $?"; tail -1 "$OUT/$tag.err"; disagree "$OUT/$tag.json"; }
            run_check linear_12M 12M 150 --op mlp --op attn_out --op attn_qkv --op "matmul a^T@b +=" --version 5 --version 6
            run_check ln_12M 12M 90 --op layernorm --op residual_layernorm
            run_check flash_12M 12M 100 --op attn_flash --version 3 --version 4
            run_check flash_120M 120M 100 --op attn_flash --version 4
            run_check linear_120M 120M 120 --op mlp --op "matmul a^T@b +=" --version 5 --version 6
            check_model 12
            mkdir -p "$OUT/checks"
            for f in linear_12M ln_12M flash_12M flash_120M linear_120M model_12M model_120M; do
              mv "$OUT/$f.json" "$OUT/$f.err" "$OUT/checks/" 2>/dev/null; done ;;
    gemm) timeout 150 $py lab/bench/gemm.py --versions 6 --json "$OUT/gemm.json" > "$OUT/gemm.md" 2>&1
          echo "gemm exit $?"; cat "$OUT/gemm.md" ;;
    flash) timeout 200 $py lab/bench/kernels.py attn_flash --sizes 12M,120M --version 3 --version 4 --markdown "$OUT/flash_kernels.md" \
               > "$OUT/flash_kernels.txt" 2>&1
           echo "kernels attn_flash exit $?"; grep "^|" "$OUT/flash_kernels.md" ;;
    mlp6) compare_versions mlp6 mlp 13 200 "5 6" --mlp-version 6 ;;     # the MLP's v6 (sums kept in registers) against v5
    v8) # matmul v8 (swizzled tiles) against v7, and the linear ops on each: harness at 12M, the
        # whole model (the engine's: v8), products beside cuBLAS, the step with both
        timeout 200 $py -m lab.check --size 12M --seed 23 --ops-only --op attn_qkv --op attn_out --op mlp --op loss \
            --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --version 7 --version 8 --json > "$OUT/v8_check_12M.json" 2> "$OUT/v8_check_12M.err"
        echo "v8 check 12M exit $?"; tail -1 "$OUT/v8_check_12M.err"; disagree "$OUT/v8_check_12M.json"
        check_model 29
        timeout 150 $py lab/bench/gemm.py --versions 7,8 --json "$OUT/gemm_v8.json" > "$OUT/gemm_v8.md" 2>&1
        echo "gemm exit $?"; grep "^|" "$OUT/gemm_v8.md"
        timeout 200 $py lab/bench/step_time.py --sizes 12M 120M --recipe fp32 tf32x3t --json "$OUT/v8_step.json" > "$OUT/v8_step.txt" 2>&1
        echo "step exit $?"; grep -v '^{' "$OUT/v8_step.txt"
        mkdir -p "$OUT/v8"; mv "$OUT"/model_* "$OUT"/v8_check_* "$OUT/v8/" ;;
    mlp9) compare_versions mlp9 mlp 37 200 "8 9" --mlp-version 9 ;;     # the MLP's v9 (the GELU a pass of its own) against v8
    flash5) compare_versions flash5 attn_flash 41 240 "3 5 6" --flash-version "3 5 6" ;;   # flash v5 (v7's split), v6 (swizzled) against v3
    flash10) # flash v10 (D from 128-bit loads) against v9's bits, the harness on it at 12M, and at 120M
         # on it and flash9-mlp12's versions (mlp v11, v12, loss_fwd v9, flash v9)
        mkdir -p "$OUT/flash10"
        timeout 90 $py lab/bench/same_bits.py --size 12M --op attn_flash --versions 9 10 --json "$OUT/flash10/bits_flash_9_10.json" \
            > "$OUT/flash10/bits_flash_9_10.txt" 2>&1; echo "same_bits attn_flash 9 10 exit $?"; tail -1 "$OUT/flash10/bits_flash_9_10.txt"
        timeout 100 $py -m lab.check --size 12M --seed 101 --ops-only --op attn_flash --version 10 --json \
            > "$OUT/flash10/check_12M.json" 2> "$OUT/flash10/check_12M.err"
        echo "flash10 check 12M exit $?"; tail -1 "$OUT/flash10/check_12M.err"; disagree "$OUT/flash10/check_12M.json"
        timeout 200 $py -m lab.check --size 120M --seed 103 --ops-only --op mlp --op loss --op attn_flash \
            --version 9 --version 10 --version 11 --version 12 --json > "$OUT/flash10/check_120M.json" 2> "$OUT/flash10/check_120M.err"
        echo "flash10 check 120M exit $?"; tail -1 "$OUT/flash10/check_120M.err"; disagree "$OUT/flash10/check_120M.json" ;;
    ahead) # compiling ahead on worker processes against compiling at launch: the same PTX, and how long
        timeout 240 $py lab/bench/compile_ahead_check.py --size ${AHEAD_SIZE:-12M} --json "$OUT/ahead_${AHEAD_SIZE:-12M}.json" \
            > "$OUT/ahead_${AHEAD_SIZE:-12M}.md" 2> "$OUT/ahead_${AHEAD_SIZE:-12M}.err"
        echo "ahead exit $?"; head -1 "$OUT/ahead_${AHEAD_SIZE:-12M}.md"; tail -3 "$OUT/ahead_${AHEAD_SIZE:-12M}.err"
        # two 30-step 12M runs, each in its own process: kernels compiled at their first launch, and
        # compiled ahead on worker processes: the same losses and the same checkpoint, bit for bit
        rm -rf $tmp/lazy $tmp/ahead
        $py -m andrea_numba.train --size 12M --steps 30 --out $tmp/lazy --compile-workers 0 --log-every 10 > "$OUT/ahead_lazy.txt" 2>&1
        echo "lazy exit $?"
        $py -m andrea_numba.train --size 12M --steps 30 --out $tmp/ahead --log-every 10 > "$OUT/ahead_ahead.txt" 2>&1
        echo "ahead run exit $?"; grep "^compiled" "$OUT/ahead_ahead.txt"
        $py - "$tmp" > "$OUT/ahead_runs.json" <<'PY'
import hashlib, json, sys
from andrea_numba.runlog import read_loss
key = lambda d: [(r["step"], r["train_loss"], r.get("val_loss"), r["grad_norm"]) for r in read_loss(d)]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
T = sys.argv[1]
res = {"losses_identical": key(f"{T}/lazy") == key(f"{T}/ahead"), "steps": len(key(f"{T}/ahead")),
       "checkpoints_identical": sha(f"{T}/lazy/checkpoint.bin") == sha(f"{T}/ahead/checkpoint.bin")}
print(json.dumps(res))
PY
        cat "$OUT/ahead_runs.json" ;;
    default) # the default run as a student starts it, timed from outside too; its loss, state and
        # samples files into $OUT/default/ (not its checkpoints), the loss plot beside them
        mkdir -p "$OUT/default"; rm -rf $tmp/run12M
        /usr/bin/time -v $py -m andrea_numba.train --size 12M --out $tmp/run12M > "$OUT/default/train.txt" \
            2> "$OUT/default/train.time"; echo "default run exit $?"
        grep -E "^(compil|launches|done|memory)" "$OUT/default/train.txt"; grep "Elapsed" "$OUT/default/train.time"
        for f in .loss.json .state.json .samples.json; do cp $tmp/run12M/$f "$OUT/default/${f#.}"; done
        $py -m andrea_numba.plot $tmp/run12M --out "$OUT/default/loss_12M.png" > /dev/null 2>&1; echo "plot exit $?" ;;
    flash10-mlp12-120M) # the harness at 120M on mlp v11/v12, loss_fwd v9 and flash v9/v10, and the
        # whole model at 12M with the engine's kernels: four processes at once (each compiles its own
        # kernels, the slow part), into $OUT/flash10-mlp12-120M/
        mkdir -p "$OUT/flash10-mlp12-120M"
        check120() {   # check120 TAG SEED OP VERSIONS...
          local tag=$1 seed=$2 op=$3; shift 3
          local vflags=(); for v in "$@"; do vflags+=(--version "$v"); done
          timeout 420 $py -m lab.check --size 120M --seed "$seed" --ops-only --op "$op" "${vflags[@]}" --json \
              > "$OUT/flash10-mlp12-120M/check_120M_$tag.json" 2> "$OUT/flash10-mlp12-120M/check_120M_$tag.err"; echo "check 120M $tag exit $?"
        }
        check120 mlp 107 mlp 11 12 & check120 loss 109 loss 9 & check120 flash 113 attn_flash 9 10 &
        timeout 420 $py -m lab.check --size 12M --seed 127 --model-only --json > "$OUT/flash10-mlp12-120M/model_12M.json" \
            2> "$OUT/flash10-mlp12-120M/model_12M.err"; echo "model 12M exit $?"
        wait
        for f in "$OUT"/flash10-mlp12-120M/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done ;;
    bf16) # matmul v10 (bf16 tensor cores) against v8 (3xTF32): the harness on the three product cases
        # at 12M and 120M at once (against the rounded twin and within the rounding bound of the
        # fp32 twin), then the products beside cuBLAS SGEMM and PyTorch's bf16 matmul
        mkdir -p "$OUT/bf16"
        for size in 12M 120M; do
          timeout 300 $py -m lab.check --size $size --seed 131 --ops-only --op matmul --op "matmul a@b^T" \
              --op "matmul a^T@b +=" --version 8 --version 10 --json > "$OUT/bf16/check_$size.json" \
              2> "$OUT/bf16/check_$size.err" &
        done
        wait
        for size in 12M 120M; do echo "bf16 check $size: $(tail -1 "$OUT/bf16/check_$size.err")"; disagree "$OUT/bf16/check_$size.json"; done
        timeout 240 $py lab/bench/gemm.py --versions 8,10 --json "$OUT/bf16/gemm.json" > "$OUT/bf16/gemm.md" 2> "$OUT/bf16/gemm.err"
        echo "gemm exit $?"; grep "^|" "$OUT/bf16/gemm.md"; tail -3 "$OUT/bf16/gemm.err" ;;
    bf16b) # the linear ops' bf16 versions (attn_qkv, attn_out v9, mlp v13, loss_fwd v10, loss_bwd v9) at
        # 12M, and the whole model with bf16 products against the twin at bf16, at 12M and 120M: at once
        mkdir -p "$OUT/bf16b"
        timeout 230 $py -m lab.check --size 12M --seed 137 --ops-only --op attn_qkv --op attn_out --op mlp \
            --op loss --version 9 --version 10 --version 13 --json > "$OUT/bf16b/ops_12M.json" 2> "$OUT/bf16b/ops_12M.err" &
        for size in 12M 120M; do
          timeout 230 $py -m lab.check --size $size --seed 139 --model-only --recipe bf16w --json \
              > "$OUT/bf16b/model_$size.json" 2> "$OUT/bf16b/model_$size.err" &
        done
        wait
        for f in "$OUT"/bf16b/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done ;;
    bf16c) # the 16-bit step beside PyTorch bf16 (12M and 120M); the harness on the
        # linear ops' bf16 and fp16 versions (attn_qkv, attn_out v9/v10, mlp v13/v14, loss_fwd v10/v11,
        # loss_bwd v9/v10) at 12M and 120M, matmul v11 at both, and the whole model with bf16 and fp16
        # products at 12M (and bf16 at 120M), with their tolerances: five processes at once, each compiling
        # its kernels on two more first (check --compile-workers)
        mkdir -p "$OUT/bf16c"
        for size in 12M 120M; do
          timeout 300 $py -m lab.check --size $size --seed 149 --compile-workers 2 --ops-only --op attn_qkv --op attn_out --op mlp \
              --op loss --op matmul --op "matmul a^T@b +=" --version 9 --version 10 --version 11 --version 13 \
              --version 14 --json > "$OUT/bf16c/ops_$size.json" 2> "$OUT/bf16c/ops_$size.err" &
        done
        for run in "12M bf16w" "12M fp16" "120M bf16w"; do set -- $run
          timeout 300 $py -m lab.check --size $1 --seed 151 --compile-workers 2 --model-only --recipe $2 --json \
              > "$OUT/bf16c/model_$1_$2.json" 2> "$OUT/bf16c/model_$1_$2.err" &
        done
        wait
        for f in "$OUT"/bf16c/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 300 $py lab/bench/step_time.py --sizes 12M 120M --recipe fp32 bf16w fp16 --json "$OUT/bf16c/step.json" \
            > "$OUT/bf16c/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$OUT/bf16c/step.txt" ;;
    bf16d) # started in the background (a later step's wait, or bf16d_report, waits for them): the harness
        # of the 16-bit versions of the linear ops at 120M (four compile workers), and the whole model
        # with fp16 products at 12M with the loss scaled as in training (check.MODEL_DLOSS)
        mkdir -p "$OUT/bf16d"
        timeout 450 $py -m lab.check --size 120M --seed 149 --compile-workers 4 --ops-only --op attn_qkv \
            --op attn_out --op mlp --op loss --op matmul --op "matmul a^T@b +=" --version 9 --version 10 --version 11 \
            --version 13 --version 14 --json > "$OUT/bf16d/ops_120M.json" 2> "$OUT/bf16d/ops_120M.err" &
        timeout 200 $py -m lab.check --size 12M --seed 151 --compile-workers 2 --model-only --recipe fp16 \
            --json > "$OUT/bf16d/model_12M_f16w.json" 2> "$OUT/bf16d/model_12M_f16w.err" & ;;
    bf16d_report) wait
        for f in "$OUT"/bf16d/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done ;;
    resume16) # bit-exact resume in bf16 and fp16: for each, 12M run a (60 steps straight) and run b
        # (SIGTERM after 30 logged steps, then --resume), both precisions at once: the same losses, loss
        # scales and checkpoint bytes
        mkdir -p "$OUT/resume16"; rm -rf $tmp/r16
        resume_pair() {   # resume_pair PRECISION
          local p=$1 d=$tmp/r16/$1 args="--size 12M --microbatches 1 --steps 60 --log-every 20 --compile-workers 4"
          $py -m andrea_numba.train $args --precision $p --out $d/a > "$OUT/resume16/${p}_a.log" 2>&1; echo "$p a exit $?"
          $py -m andrea_numba.train $args --precision $p --out $d/b > "$OUT/resume16/${p}_b1.log" 2>&1 &
          local pid=$!
          local waited=0     # (at most 200 s: a run b that died before its 30th step must not hang the script)
          until [ -f $d/b/.loss.json ] && [ "$(wc -l < $d/b/.loss.json)" -ge 30 ]; do
            sleep 0.1; waited=$((waited + 1)); if [ $waited -ge 2000 ] || ! kill -0 $pid 2>/dev/null; then break; fi
          done
          kill -TERM $pid; wait $pid; echo "$p b (SIGTERM) exit $?"
          $py -m andrea_numba.train --resume $d/b > "$OUT/resume16/${p}_b2.log" 2>&1; echo "$p b (resume) exit $?"
        }
        resume_pair bf16 & resume_pair fp16 & wait
        $py - "$tmp" > "$OUT/resume16/check.json" <<'PY'
import hashlib, json, sys
from andrea_numba.runlog import read_loss
key = lambda d: [(r["step"], r["train_loss"], r.get("val_loss"), r["lr"], r["grad_norm"], r.get("loss_scale"))
                 for r in read_loss(d)]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
T, res = sys.argv[1], {}
for p in ("bf16", "fp16"):
    a, b = key(f"{T}/r16/{p}/a"), key(f"{T}/r16/{p}/b")
    res[p] = {"steps_a": len(a), "steps_b": len(b), "loss_json_identical": a == b,
              "checkpoints_identical": sha(f"{T}/r16/{p}/a/checkpoint.bin") == sha(f"{T}/r16/{p}/b/checkpoint.bin")}
print(json.dumps(res))
PY
        cat "$OUT/resume16/check.json"; grep -h "stopped by signal\|resumed from\|loss scale" "$OUT"/resume16/*_b*.log | head -8 ;;
    bf16l-cublas16) # the 16-bit products and flash v11/v12 (the timing tables at the end, alone on the GPU):
        #  1. the harness, all at once: matmul v12 and the cuBLASLt bf16/fp16 route (v21, v22: operands
        #     rounded into 16-bit copies) at 12M and 120M; the linear ops on v12's tiles (attn_qkv, attn_out
        #     v11, mlp v15, loss_fwd v12, loss_bwd v11) at 12M; flash attention v11 (bf16) and v12 (fp16) at
        #     12M and 120M; the whole model with bf16l, cublas-bf16 and cublas-fp16 products at 12M;
        #  2. then: the step at 12M and 120M with bf16l and cublas-bf16 products, flash v10 and v11, beside
        #     PyTorch bf16; v10, v12, v21, v22 beside cuBLAS SGEMM and PyTorch bf16; flash v8/v10 against
        #     v11/v12 kernel by kernel
        mkdir -p "$OUT/bf16l-cublas16"; d="$OUT/bf16l-cublas16"
        for size in 12M 120M; do
          timeout 240 $py -m lab.check --size $size --seed 173 --compile-workers 2 --ops-only --op matmul --op "matmul a@b^T" \
              --op "matmul a^T@b +=" --version 12 --version 21 --version 22 --json > "$d/mm_$size.json" 2> "$d/mm_$size.err" &
          timeout 240 $py -m lab.check --size $size --seed 167 --compile-workers 2 --ops-only --op attn_flash \
              --version 11 --version 12 --json > "$d/flash_$size.json" 2> "$d/flash_$size.err" &
        done
        timeout 240 $py -m lab.check --size 12M --seed 179 --compile-workers 2 --ops-only --op attn_qkv --op attn_out \
            --op mlp --op loss --version 11 --version 12 --version 15 --json > "$d/ops_12M.json" 2> "$d/ops_12M.err" &
        for products in bf16l cublas-bf16 cublas-fp16; do
          timeout 240 $py -m lab.check --size 12M --seed 181 --compile-workers 2 --model-only --recipe $products \
              --json > "$d/model_12M_$products.json" 2> "$d/model_12M_$products.err" &
        done
        wait
        for f in "$d"/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 170 $py lab/bench/step_time.py --sizes 12M 120M --recipe bf16l cublas-bf16 --flash-version 10 11 \
            --iters 3 --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        timeout 80 $py lab/bench/gemm.py --versions 10,12,21,22 --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -2 "$d/gemm.err"
        timeout 55 $py lab/bench/kernels.py attn_flash --sizes 12M,120M --version 8 --version 10 --version 11 --version 12 \
            --markdown "$d/flash_kernels.md" > "$d/flash_kernels.txt" 2>&1; echo "flash kernels exit $?"; grep "^|" "$d/flash_kernels.md" ;;
    bf16l-f16w) # bf16 (bf16l products, flash v11) and fp16 (fp16, flash v12), all at once: the 12M
        # training quality (QUALITY_STEPS), bit-exact resume in both, the whole model against the twin
        # (which runs the flash twin at that precision) at 12M
        mkdir -p "$OUT/bf16l-f16w"
        QUALITY_STEPS=${QUALITY_STEPS:-800} bash "$0" quality > "$OUT/bf16l-f16w/quality.log" 2>&1 &
        bash "$0" resume16 > "$OUT/bf16l-f16w/resume16.log" 2>&1 &
        for products in bf16l fp16; do
          timeout 200 $py -m lab.check --size 12M --seed 191 --compile-workers 2 --model-only --recipe $products \
              --json > "$OUT/bf16l-f16w/model_12M_$products.json" 2> "$OUT/bf16l-f16w/model_12M_$products.err" &
        done
        wait
        for f in "$OUT"/bf16l-f16w/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        grep "^|" "$OUT/quality.txt"; tail -3 "$OUT/bf16l-f16w/quality.log"; cat "$OUT/resume16/check.json"; tail -4 "$OUT/bf16l-f16w/resume16.log" ;;
    profile-bf16l-cublas) # where the 120M bf16 step's GPU time goes, kernel by kernel (Nsight Compute),
        # with our products (bf16l, flash v11) and with cuBLASLt's (cublas-bf16): what is left once the
        # products are fast
        for products in bf16l cublas-bf16; do profile_kernels "kernels_120M_$products" 45 --size 120M --recipe $products; done ;;
    bf16-ampere) # matmul v13's linear ops and products bf16-ampere:
        #  1. at once: the wgmma probe (lab/bench/wgmma_probe.py: can Numba drive Hopper's warpgroup
        #     products, and with which shared-memory layout); the harness on the linear ops on matmul
        #     v13 (attn_qkv, attn_out v12, mlp v16, loss_fwd v13, loss_bwd v12) and on v13 (its copies made
        #     by k_round_bf16) at 12M and 120M; the whole model with bf16-ampere products (bf16 products,
        #     LN and GELU outputs saved as bf16) at 12M and 120M; bit-exact resume in bf16 and fp16;
        #  2. alone on the GPU: the step with bf16l and bf16-ampere beside PyTorch bf16; the 120M bf16-ampere step
        #     kernel by kernel; v12, v13 and v21 beside PyTorch bf16; PyTorch bf16 through torch.compile
        mkdir -p "$OUT/bf16-ampere"; d="$OUT/bf16-ampere"
        timeout 120 $py lab/bench/wgmma_probe.py --json "$d/wgmma.json" > "$d/wgmma.txt" 2>&1 &
        for size in 12M 120M; do
          timeout 300 $py -m lab.check --size $size --seed 197 --compile-workers 2 --ops-only --op attn_qkv --op attn_out \
              --op mlp --op loss --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --version 12 --version 13 --version 16 \
              --json > "$d/ops_$size.json" 2> "$d/ops_$size.err" &
          timeout 300 $py -m lab.check --size $size --seed 199 --compile-workers 2 --model-only --recipe bf16-ampere \
              --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
        done
        bash "$0" resume16 > "$d/resume16.log" 2>&1 &
        wait
        echo "wgmma probe:"; cat "$d/wgmma.txt" | tail -25
        for f in "$d"/ops_*.json "$d"/flash_*.json "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        tail -3 "$d/resume16.log"; cat "$OUT/resume16/check.json"
        timeout 170 $py lab/bench/step_time.py --sizes 12M 120M --recipe bf16l bf16-ampere --iters 3 --json "$d/step.json" \
            > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        profile_kernels kernels_120M_bf16a 30 --size 120M --recipe bf16-ampere
        timeout 90 $py lab/bench/gemm.py --versions 12,13,21 --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -2 "$d/gemm.err"
        timeout 150 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16-ampere --iters 3 --torch-compile --json "$d/compile.json" \
            > "$d/compile.txt" 2>&1; echo "torch.compile step exit $?"; grep -v '^{' "$d/compile.txt" ;;
    cublas-bf16-step) # the step with cuBLASLt's bf16 products, their copies made by k_round_bf16,
        # beside bf16-ampere and PyTorch bf16, at 120M and 12M (first: nothing before it can
        # have left the GPU in a bad state); then mm14 (matmul v14 on wgmma: harness and products)
        mkdir -p "$OUT/cublas-bf16-step"
        timeout 150 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16-ampere cublas-bf16 --iters 3 --json "$OUT/cublas-bf16-step/step.json" \
            > "$OUT/cublas-bf16-step/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$OUT/cublas-bf16-step/step.txt"
        bash "$0" mm14 ;;
    mm14) # matmul v14 (kernels/wgmma_tile.py: wgmma m64n128k16 from v13's swizzled cp.async ring, both copies
        # K-major, transposed copies by k_round_bf16_t_v1): product_version's harness and table beside v13, v21
        product_version 14 13,14,21 ;;
    mm15) # matmul v15 (kernels/wgmma_ring.py: one wgmma group in flight (wait_group 1), BK = 64 stages of
        # 128-byte rows (the 128-byte swizzle) in a 4-stage ring of dynamic shared memory, 129 KiB, allowed by
        # matmul.allow_shared): product_version's harness and table beside v14, v21
        product_version 15 14,15,21 ;;
    bf16r) # products "bf16r" (matmul v16 = v15's wgmma where no activation is
        # copied transposed, v13 for the weight gradients; the loss's two passes and bf16 dlogits):
        #  1. at once: the harness on attn_qkv, attn_out v13, mlp v17, loss_fwd v14, loss_bwd v13 and
        #     matmul v16 at 12M and 120M; the whole model with bf16r at 12M and 120M;
        #  2. alone: the step with bf16-ampere and bf16r beside PyTorch bf16; the 120M bf16r step kernel by kernel;
        #     matmul v15 at each of its tiles (--blocks)
        mkdir -p "$OUT/bf16r"; d="$OUT/bf16r"
        for size in 12M 120M; do
          timeout 300 $py -m lab.check --size $size --seed 223 --compile-workers 2 --ops-only --op attn_qkv --op attn_out \
              --op mlp --op loss --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --version 13 --version 14 --version 16 \
              --version 17 --json > "$d/ops_$size.json" 2> "$d/ops_$size.err" &
          timeout 300 $py -m lab.check --size $size --seed 227 --compile-workers 2 --model-only --recipe bf16r \
              --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
        done
        wait
        for f in "$d"/ops_*.json "$d"/flash_*.json "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 200 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16-ampere bf16r --iters 3 --json "$d/step.json" \
            > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        profile_kernels kernels_120M_bf16r 45 --size 120M --recipe bf16r
        timeout 150 $py lab/bench/gemm.py --versions 15 --blocks --json "$d/gemm_blocks.json" > "$d/gemm_blocks.md" 2> "$d/gemm_blocks.err"
        echo "gemm --blocks exit $?"; grep "^|" "$d/gemm_blocks.md"; tail -3 "$d/gemm_blocks.err" ;;
    bf16m) # matmul v17 (wgmma_mn.py: MN-major stages read through wgmma's
        # transpose bits) and the ops on it (products "bf16m": attn_qkv, attn_out v14, mlp v18, loss v15/v14);
        # embed_bwd v5 and residual_layernorm_fwd v3; bf16r with its gradients rounded once.
        #  1. at once: the wgmma probe (the MN-major layouts); the harness at 12M and 120M on those ops, matmul
        #     v16 and v17, embed and residual_layernorm; the whole model with bf16m; bit-exact resume (bf16r)
        #  2. alone: the step with bf16r and bf16m beside PyTorch bf16; the 120M bf16m step kernel by kernel;
        #     matmul v15, v16, v17, v21; embed and residual_layernorm kernels
        mkdir -p "$OUT/bf16m"; d="$OUT/bf16m"
        timeout 240 $py lab/bench/wgmma_probe.py --json "$d/wgmma.json" > "$d/wgmma.txt" 2>&1 &
        for size in 12M 120M; do
          timeout 300 $py -m lab.check --size $size --seed 229 --compile-workers 2 --ops-only --op attn_qkv --op attn_out \
              --op mlp --op loss --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --op embed --op residual_layernorm \
              --version 3 --version 5 --version 14 --version 15 --version 16 --version 17 --version 18 \
              --json > "$d/ops_$size.json" 2> "$d/ops_$size.err" &
          timeout 300 $py -m lab.check --size $size --seed 233 --compile-workers 2 --model-only --recipe bf16m \
              --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
        done
        bash "$0" resume16 > "$d/resume16.log" 2>&1 &
        wait
        echo "wgmma probe:"; grep -i "mn_\|layouts right" "$d/wgmma.txt" | tail -30
        for f in "$d"/ops_*.json "$d"/flash_*.json "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        tail -3 "$d/resume16.log"; cat "$OUT/resume16/check.json"
        timeout 200 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16r bf16m --iters 3 --json "$d/step.json" \
            > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        profile_kernels kernels_120M_bf16m 45 --size 120M --recipe bf16m
        timeout 120 $py lab/bench/gemm.py --versions 15,16,17,21 --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -3 "$d/gemm.err"
        for op in embed residual_layernorm; do
          timeout 100 $py lab/bench/kernels.py $op --sizes 12M,120M --markdown "$d/kernels_$op.md" > "$d/kernels_$op.txt" 2>&1
          echo "kernels $op exit $?"; grep "^|" "$d/kernels_$op.md" | head -30
        done ;;
    bf16m-flash13) # products bf16m (matmul v17) with flash attention v13:
        #  1. at once (170 s at most): the harness at 12M and 120M on flash v13, embed v5, residual_layernorm
        #     v3, matmul v16/v17 and the linear ops' v13-v18; the whole 120M model with the engine's bf16;
        #     bit-exact resume in bf16 and fp16
        #  2. alone: the step with bf16m, flash v11 and v13, beside PyTorch bf16; flash v11 and v13's kernels
        #     at 120M; matmul v17 beside v21
        mkdir -p "$OUT/bf16m-flash13"; d="$OUT/bf16m-flash13"
        for size in 12M 120M; do
          timeout 170 $py -m lab.check --size $size --seed 239 --compile-workers 3 --ops-only --op attn_qkv --op attn_out \
              --op mlp --op loss --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --op embed --op residual_layernorm \
              --version 3 --version 5 --version 13 --version 14 --version 15 --version 16 --version 17 \
              --version 18 --json > "$d/ops_$size.json" 2> "$d/ops_$size.err" &
          timeout 170 $py -m lab.check --size $size --seed 251 --compile-workers 2 --ops-only --op attn_flash \
              --version 13 --json > "$d/flash_$size.json" 2> "$d/flash_$size.err" &
        done
        timeout 170 $py -m lab.check --size 120M --seed 241 --compile-workers 3 --model-only --recipe bf16m \
            --json > "$d/model_120M.json" 2> "$d/model_120M.err" &
        timeout 170 bash "$0" resume16 > "$d/resume16.log" 2>&1 &
        wait
        for f in "$d"/ops_*.json "$d"/flash_*.json "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        tail -3 "$d/resume16.log"; cat "$OUT/resume16/check.json"
        timeout 130 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16m --flash-version 11 13 --iters 3 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        timeout 60 $py lab/bench/kernels.py attn_flash --sizes 120M --version 11 --version 13 --markdown "$d/flash.md" \
            > "$d/flash.txt" 2>&1; echo "kernels attn_flash exit $?"; grep "^|" "$d/flash.md" | head -30
        timeout 45 $py lab/bench/gemm.py --versions 17,21 --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -3 "$d/gemm.err" ;;
    mm23) # matmul v23 (v19 with the loads of its in-kernel split-K sums batched,
        # wgmma_tma.py point 6) beside v18 (k_splitk_sum after the product) and v19 on every product of
        # lab/bench/gemm.py, the weight gradients' split shapes among them; v23's bits in the whole 120M and 12M
        # bf16-hopper step (lab/bench/model_bits.py --matmul 23); the step with v18, v23 and v19 (--tma-matmul)
        mkdir -p "$OUT/mm23"; d="$OUT/mm23"
        timeout 200 $py lab/bench/gemm.py --versions 18,19,23 --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -3 "$d/gemm.err"
        for size in 120M 12M; do
          timeout 150 $py lab/bench/model_bits.py --sizes $size --same bf16-hopper bf16-hopper --matmul 23 --json "$d/bits_$size.json" \
              > "$d/bits_$size.txt" 2>&1; echo "model_bits $size exit $?: $(tail -1 "$d/bits_$size.txt")"
        done
        timeout 240 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16-hopper --tma-matmul 18 23 19 --iters 30 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt" ;;
    fp8-probe) # which cuBLASLt FP8 product forms run (lab/bench/fp8_probe.py, cuBLASLt's log kept); before fp8-checks
        mkdir -p "$OUT/fp8-probe"; CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE="$OUT/fp8-probe/lt.log" timeout 100 $py lab/bench/fp8_probe.py \
            > "$OUT/fp8-probe/probe.txt" 2>&1; echo "probe exit $?"; grep -v "^\[" "$OUT/fp8-probe/probe.txt" | tail -8
        grep -i "error\|not supported\|fail" "$OUT/fp8-probe/lt.log" | head -8; gzip -f "$OUT/fp8-probe/lt.log" ;;
    fp8-step) # the FP8 kernels against the twin at 120M; the whole model at each scope against the twin at
        # 12M; the step at 120M and 12M with bf16-hopper, cuBLASLt bf16 and the three FP8 scopes beside PyTorch; bit-exact
        # resume at fp8-e5m2
        d="$OUT/fp8-step"; mkdir -p "$d"
        for sc in fp8-fwd fp8-all; do
          timeout 400 $py -m lab.check --size 12M --seed 319 --compile-workers 1 --model-only \
              --recipe cublas-$sc --json > "$d/model_12M_$sc.json" 2> "$d/model_12M_$sc.err" &
        done
        timeout 300 $py -m andrea_numba.fp8 check --size 120M --json "$d/check_120M.json" > "$d/check_120M.txt" 2>&1
        echo "fp8 check 120M exit $?"; grep -v " ok$" "$d/check_120M.txt" | tail -12
        timeout 300 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16-hopper cublas-bf16 cublas-fp8-fwd cublas-fp8-e5m2 \
            cublas-fp8-all --iters 20 --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        resume_bf16 "$d" fp8-e5m2
        wait; for f in "$d"/model_12M_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done ;;
    fp8-quality) # 12M trained QUALITY_STEPS (2000) steps in fp32, bf16 and the three FP8 scopes at once
        # (lab/bench/precision_runs.py --parallel), the validation curves on one plot, the FP8 runs' amax and underflow
        # history (python -m andrea_numba.fp8 history)
        d="$OUT/fp8-quality"; mkdir -p "$d"; rm -rf $tmp/q8
        timeout ${QUALITY_TIMEOUT:-540} $py lab/bench/precision_runs.py --out $tmp/q8 --size 12M --steps "${QUALITY_STEPS:-2000}" \
            --precisions fp32,bf16,fp8-fwd,fp8-e5m2,fp8-all --parallel > "$d/quality.txt" 2>&1
        echo "quality exit $?"; grep "^|" "$d/quality.txt" | tail -12; grep -i "error\|diverged" "$d/quality.txt" | head -5
        cp $tmp/q8/precision_runs.* "$d/"; for r in fp8-fwd fp8-e5m2 fp8-all; do cp $tmp/q8/$r/.fp8.json "$d/$r.fp8.json"; done
        for r in fp32 bf16 fp8-fwd fp8-e5m2 fp8-all; do cp $tmp/q8/$r/.loss.json "$d/$r.loss.json"; cp $tmp/q8/$r/.state.json "$d/$r.state.json"; done
        $py -m andrea_numba.fp8 history $tmp/q8/fp8-fwd $tmp/q8/fp8-e5m2 $tmp/q8/fp8-all --plot "$d/fp8_history.png" \
            > "$d/history.txt" 2>&1; echo "history exit $?"; grep -v "  0.00%" "$d/history.txt" | head -40 ;;
    fp8-checks) # the FP8 kernels against the twin at 12M (quantize rows, matmul v24, the linear
        # ops at every scope), the whole fp8-e5m2 model against the twin (meanwhile), FP8 products against bf16 ones
        # (lab/bench/fp8_gemm.py), a 30-step 12M training smoke run at fp8-e5m2 and its .fp8.json record
        d="$OUT/fp8-checks"; mkdir -p "$d"
        timeout 300 $py -m lab.check --size 12M --seed 317 --compile-workers 2 --model-only \
            --recipe cublas-fp8-e5m2 --json > "$d/model_12M.json" 2> "$d/model_12M.err" &
        timeout 200 $py -m andrea_numba.fp8 check --size 12M --json "$d/check_12M.json" > "$d/check_12M.txt" 2>&1
        echo "fp8 check 12M exit $?"; grep -v " ok$" "$d/check_12M.txt" | tail -30; tail -2 "$d/check_12M.txt"
        timeout 150 $py lab/bench/fp8_gemm.py --json "$d/gemm.json" > "$d/gemm.txt" 2>&1; echo "fp8_gemm exit $?"; cat "$d/gemm.txt"
        rm -rf $tmp/f8; timeout 150 $py -m andrea_numba.train --size 12M --precision fp8-e5m2 --steps 30 --log-every 10 \
            --out $tmp/f8 --compile-workers 4 > "$d/train_smoke.txt" 2>&1; echo "train smoke exit $?"
        grep -v "^step  *[0-9]*/.*ETA" "$d/train_smoke.txt" | tail -8; grep "^step" "$d/train_smoke.txt" | tail -3
        cp $tmp/f8/.fp8.json "$d/fp8_smoke.json" 2>/dev/null; head -c 700 "$d/fp8_smoke.json"; echo
        wait; echo "model_12M.json: $(tail -1 "$d/model_12M.err")"; disagree "$d/model_12M.json" ;;
    bf16-hopper-loss18) # products bf16-hopper with the loss keeping the logits (loss_fwd v18, loss_bwd v16: M and se saved a row, the
        # softmax recomputed in the backward): its bits against bf16s's at 120M and 12M, the whole model
        # against the twin at 120M, the step x30 (bf16-hopper, bf16s), bit-exact resume in bf16 (the engine's: bf16-hopper), the
        # 120M step kernel by kernel
        same_bits_then_time bf16-hopper-loss18 bf16s bf16-hopper 120M 313 30 resume || continue ;;
    bf16-hopper) # products bf16-hopper: flash attention v14 and residual_layernorm_bwd v6 write the products'
        # activation operands in bf16: its bits against bf16s's (lab/bench/model_bits.py) at 120M and 12M, the whole
        # model against the twin at 12M, the step x20 (bf16-hopper, bf16s) and the 120M step kernel by kernel
        same_bits_then_time bf16-hopper bf16s bf16-hopper 12M 311 20 || continue ;;
    bf16s) # products bf16s (bf16t with every weight rounded once a forward into
        # params16) against bf16t: the whole model at 12M and 120M, the step x20; mlp v20 (the GELU in v18's
        # epilogues) against v19 (bits and times at 120M, the step with it); the 120M step kernel by kernel
        mkdir -p "$OUT/bf16s"; d="$OUT/bf16s"
        for size in 12M 120M; do
          timeout 200 $py -m lab.check --size $size --seed 307 --compile-workers 2 --model-only --recipe bf16s \
              --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
        done
        wait
        for f in "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 200 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16s bf16t --iters 20 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        timeout 100 $py lab/bench/mlp_v20_bits.py --size 120M --json "$d/mlp20.json" > "$d/mlp20.txt" 2>&1
        echo "mlp_v20_bits exit $?"; cat "$d/mlp20.txt"
        timeout 150 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16s --mlp-version 20 --iters 20 \
            --json "$d/step_mlp20.json" > "$d/step_mlp20.txt" 2>&1; echo "step (mlp v20) exit $?"; grep -v '^{' "$d/step_mlp20.txt"
        OUT=$d profile_kernels kernels_120M_bf16s 30 --size 120M --recipe bf16s ;;
    ln5-step) # the engine with residual_layernorm_bwd v5: the whole model at 12M and
        # 120M (bf16t) and at 12M (fp32), then the step at 120M and 12M with bf16t and the engine's fp32, 20 iterations
        mkdir -p "$OUT/ln5-step"; d="$OUT/ln5-step"
        for size in 12M 120M; do
          timeout 200 $py -m lab.check --size $size --seed 293 --compile-workers 2 --model-only --recipe bf16t \
              --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
        done
        timeout 200 $py -m lab.check --size 12M --seed 293 --compile-workers 2 --model-only \
            --json > "$d/model_12M_fp32.json" 2> "$d/model_12M_fp32.err" &
        wait
        for f in "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 200 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16t fp32 --iters 20 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt" ;;
    mm18-tiles-ln5) # matmul v18's tiles and the operand layouts: 1. v18's bits against v17 at every tile (128 x 128
        # with 3 stages, two blocks a multiprocessor, among them); 2. the products at every tile; 3. one product
        # with each operand K- or MN-major (lab/bench/v18_layouts.py); 4. the harness on residual_layernorm v5 at 12M
        # and 120M
        mkdir -p "$OUT/mm18-tiles-ln5"; d="$OUT/mm18-tiles-ln5"
        timeout 120 $py lab/bench/v18_bits.py --json "$d/bits.json" > "$d/bits.txt" 2>&1; rc=$?
        echo "v18_bits exit $rc"; grep -v identical "$d/bits.txt" | tail -8; grep -c identical "$d/bits.txt"
        timeout 150 $py lab/bench/gemm.py --versions 18 --blocks --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -3 "$d/gemm.err"
        python3 -c "import json,sys; [print(r['product'], r.get('v18_blocks_ms')) for r in json.load(open(sys.argv[1]))]" "$d/gemm.json"
        timeout 90 $py lab/bench/v18_layouts.py --json "$d/layouts.json" > "$d/layouts.md" 2>&1; echo "layouts exit $?"; cat "$d/layouts.md" | tail -8
        for size in 12M 120M; do
          timeout 150 $py -m lab.check --size $size --seed 283 --compile-workers 2 --ops-only --op residual_layernorm \
              --version 4 --version 5 --json > "$d/ln_$size.json" 2> "$d/ln_$size.err" &
        done
        wait
        for size in 12M 120M; do echo "ln $size: $(tail -1 "$d/ln_$size.err")"; disagree "$d/ln_$size.json"; done
        timeout 60 $py lab/bench/kernels.py residual_layernorm --sizes 120M --version 4 --version 5 --markdown "$d/ln_kernels.md" \
            > "$d/ln_kernels.txt" 2>&1; echo "kernels residual_layernorm exit $?"; grep "^|" "$d/ln_kernels.md" | head -12 ;;
    bf16t) # products bf16t: 1. at once: the harness at 12M on loss v17 (k_loss_fwd_rows)
        # and v18's ops, the whole bf16t model at 12M and 120M; 2. the step at 120M and 12M with bf16t, bf16m and
        # cuBLASLt's products, 20 iterations (PyTorch's eager time varies by a few ms run to run); 3. bit-exact
        # resume in bf16 (12M, 60 steps against 30 + SIGTERM + resume); 4. the 120M bf16t step kernel by kernel
        mkdir -p "$OUT/bf16t"; d="$OUT/bf16t"
        timeout 200 $py -m lab.check --size 12M --seed 277 --compile-workers 4 --ops-only --op loss \
            --op attn_qkv --op attn_out --op mlp --version 15 --version 17 --version 19 \
            --json > "$d/ops_12M.json" 2> "$d/ops_12M.err" &
        for size in 12M 120M; do
          timeout 200 $py -m lab.check --size $size --seed 281 --compile-workers 2 --model-only --recipe bf16t \
              --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
        done
        wait
        for f in "$d"/ops_12M.json "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 200 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16t bf16m cublas-bf16 --iters 20 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        resume_bf16 "$d"
        OUT=$d profile_kernels kernels_120M_bf16t 30 --size 120M --recipe bf16t ;;
    mm18-stores) # matmul v18 with paired stores and the tile order along the shorter side: its bits against
        # v17; its products at every tile beside PyTorch bf16; the step with bf16t at 120M and 12M; the 120M bf16t
        # step kernel by kernel; one v18 launch (the 120M MLP's x @ W_1) under Nsight Compute's sections
        mkdir -p "$OUT/mm18-stores"; d="$OUT/mm18-stores"
        timeout 120 $py lab/bench/v18_bits.py --json "$d/bits.json" > "$d/bits.txt" 2>&1; rc=$?
        echo "v18_bits exit $rc"; tail -4 "$d/bits.txt"; grep -c identical "$d/bits.txt"
        if [ $rc -ne 0 ]; then cat "$d/bits.txt"; echo "mm18-stores: v18 is not right here: stopping"; continue; fi
        timeout 120 $py lab/bench/gemm.py --versions 18 --blocks --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -3 "$d/gemm.err"
        python3 -c "import json,sys; [print(r['product'], r.get('v18_blocks_ms')) for r in json.load(open(sys.argv[1]))]" "$d/gemm.json"
        timeout 120 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16t --iters 3 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt"
        OUT=$d profile_kernels kernels_120M_bf16t 45 --size 120M --recipe bf16t
        cat > $tmp/one_v18.py <<'PY'
import numpy as np
from numba import cuda
from andrea_numba.kernels import matmul as MM
M, N, K = 8192, 3072, 768
a = cuda.to_device(np.random.rand(M, K).astype(np.float32))
b = cuda.to_device(np.random.rand(K, N).astype(np.float32))
out = cuda.device_array((M, N), np.float32)
MM.matmul_bf16_wgmma(out, None, a, b)
cuda.synchronize()
cuda.profile_start()
MM.matmul_bf16_wgmma(out, None, a, b)
cuda.synchronize()
cuda.profile_stop()
PY
        timeout 120 ncu --profile-from-start off -k regex:k_matmul_bf16_wgmma --section SpeedOfLight --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
            $py $tmp/one_v18.py > "$d/ncu_v18_mlp.txt" 2>&1; echo "ncu v18 exit $?"
        grep -v "^==PROF==" "$d/ncu_v18_mlp.txt" | grep -E "Duration|Throughput|Busy|Stall|Eligible|Issued|Warp Cycles|Registers|Achieved|Theoretical Occ|L2 Hit|Mem Pipes|DRAM" | head -40 ;;
    mm18) # matmul v18 (TMA, producer warp, mbarriers,
        # persistent blocks) and products bf16t. 1. lab/bench/v18_bits.py: v18 against v17's bits at every tile
        # (a hang or a wrong product stops the step here); 2. at once: the harness at 12M on matmul v18 and the
        # bf16t linear ops, the whole bf16t model at 12M; 3. the products of v17 and v18 (every tile) beside
        # PyTorch bf16; 4. the step at 120M and 12M, bf16m against bf16t
        mkdir -p "$OUT/mm18"; d="$OUT/mm18"
        timeout 150 $py lab/bench/v18_bits.py --json "$d/bits.json" > "$d/bits.txt" 2>&1; rc=$?
        echo "v18_bits exit $rc"; cat "$d/bits.txt" | tail -30
        if [ $rc -ne 0 ]; then echo "mm18: v18 is not right here: stopping"; continue; fi
        timeout 200 $py -m lab.check --size 12M --seed 269 --compile-workers 4 --ops-only --op attn_qkv \
            --op attn_out --op mlp --op loss --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" \
            --version 15 --version 16 --version 18 --version 19 --json > "$d/ops_12M.json" 2> "$d/ops_12M.err" &
        timeout 200 $py -m lab.check --size 12M --seed 271 --compile-workers 2 --model-only --recipe bf16t \
            --json > "$d/model_12M.json" 2> "$d/model_12M.err" &
        wait
        for f in "$d"/ops_12M.json "$d"/model_12M.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 170 $py lab/bench/gemm.py --versions 17,18 --blocks --json "$d/gemm.json" > "$d/gemm.md" 2> "$d/gemm.err"
        echo "gemm exit $?"; grep "^|" "$d/gemm.md"; tail -3 "$d/gemm.err"
        python3 -c "import json,sys; [print(r['product'], r.get('v18_blocks_ms')) for r in json.load(open(sys.argv[1]))]" "$d/gemm.json"
        timeout 130 $py lab/bench/step_time.py --sizes 120M 12M --recipe bf16m bf16t --iters 3 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt" ;;
    bf16m-profile) # products bf16m in the harness and the model, with longer limits than bf16m-flash13's:
        #  1. at once (330 s at most): the harness at 12M and 120M on bf16m's versions (attn_qkv,
        #     attn_out v14, mlp v18, loss v15/v14, matmul v17) and on embed_bwd v5 and residual_layernorm v3
        #     (their rows only); the whole model with bf16m at 12M and 120M;
        #  2. alone: the 120M bf16m step kernel by kernel; flash attention v11 and v13 kernel by kernel at 120M
        #     (every block); the step with bf16m beside cuBLASLt's products (cublas-bf16) at 120M
        mkdir -p "$OUT/bf16m-profile"; d="$OUT/bf16m-profile"
        for size in 12M 120M; do
          timeout 330 $py -m lab.check --size $size --seed 257 --compile-workers 4 --ops-only --op attn_qkv --op attn_out \
              --op mlp --op loss --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --op embed --op residual_layernorm \
              --version 3 --version 5 --version 14 --version 15 --version 17 --version 18 \
              --json > "$d/ops_$size.json" 2> "$d/ops_$size.err" &
          timeout 330 $py -m lab.check --size $size --seed 263 --compile-workers 2 --model-only --recipe bf16m \
              --json > "$d/model_$size.json" 2> "$d/model_$size.err" &
        done
        wait
        for f in "$d"/ops_*.json "$d"/model_*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        profile_kernels kernels_120M_bf16m 60 --size 120M --recipe bf16m
        timeout 150 $py lab/bench/kernels.py attn_flash --sizes 120M --version 11 --version 13 --markdown "$d/flash.md" \
            > "$d/flash.txt" 2>&1; echo "kernels attn_flash exit $?"; grep "^|" "$d/flash.md" | head -40
        timeout 120 $py lab/bench/step_time.py --sizes 120M --recipe bf16m cublas-bf16 --iters 3 \
            --json "$d/step.json" > "$d/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$d/step.txt" ;;
    quality-floor) # the quality question at the default 2,000 steps with its noise
        # floor (a second fp32 run whose sums differ: fp32/cublas) and both routes of bf16, five runs at
        # once; meanwhile the whole model with the engine's bf16 and fp16 at 120M; then flash attention's
        # kernels v8/v10 against v11/v12 at both sizes, alone on the GPU
        mkdir -p "$OUT/quality-floor"
        timeout 520 $py lab/bench/precision_runs.py --out $tmp/q11 --size 12M --steps "${QUALITY_STEPS:-2000}" --parallel \
            --precisions "${FLOOR_PRECISIONS:-fp32,fp32/cublas,bf16,bf16/cublas,fp16}" > "$OUT/quality-floor/quality.txt" 2>&1 &
        for products in bf16l fp16; do
          timeout 300 $py -m lab.check --size 120M --seed 193 --compile-workers 4 --model-only --recipe $products \
              --json > "$OUT/quality-floor/model_120M_$products.json" 2> "$OUT/quality-floor/model_120M_$products.err" &
        done
        wait
        cp $tmp/q11/precision_runs.* "$OUT/quality-floor/"; grep "^|" "$OUT/quality-floor/quality.txt"
        for f in "$OUT"/quality-floor/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        [ "${FLOOR_FLASH:-1}" = 0 ] && continue      # FLOOR_FLASH=0: without the flash kernel table
        timeout 100 $py lab/bench/kernels.py attn_flash --sizes 12M,120M --version 8 --version 10 --version 11 --version 12 \
            --markdown "$OUT/quality-floor/flash_kernels.md" > "$OUT/quality-floor/flash_kernels.txt" 2>&1; echo "flash kernels exit $?"
        grep "^|" "$OUT/quality-floor/flash_kernels.md" ;;
    cublas) # the library route (kernels/cublaslt.py, nvmath-python carried as a wheel): matmul v20-v22
        # (cuBLASLt fp32 / bf16 / fp16) in the harness at 12M and 120M; the whole model with cuBLASLt
        # products at 12M (fp32, bf16, fp16) and 120M (bf16); v20-v22 timed beside v8, v10 and PyTorch
        # bf16; the step with cublas-bf16 beside bf16w and PyTorch bf16; a 12M bf16 run of 30 steps with
        # cuBLASLt products as a graph and eagerly: the same losses and checkpoint, bit for bit
        mkdir -p "$OUT/cublas"
        $py -c "import nvmath; from nvmath.bindings import cublasLt; print('nvmath', nvmath.__version__, 'cublasLt', cublasLt.get_version())"
        for size in 12M 120M; do
          timeout 200 $py -m lab.check --size $size --seed 157 --ops-only --op matmul --op "matmul a@b^T" \
              --op "matmul a^T@b +=" --version 20 --version 21 --version 22 --json > "$OUT/cublas/ops_$size.json" \
              2> "$OUT/cublas/ops_$size.err" &
        done
        for run in "12M cublas-fp32" "12M cublas-bf16" "12M cublas-fp16" "120M cublas-bf16"; do set -- $run
          timeout 200 $py -m lab.check --size $1 --seed 163 --model-only --recipe $2 --json \
              > "$OUT/cublas/model_$1_$2.json" 2> "$OUT/cublas/model_$1_$2.err" &
        done
        wait
        for f in "$OUT"/cublas/*.json; do echo "$(basename "$f"): $(tail -1 "${f%.json}.err")"; disagree "$f"; done
        timeout 150 $py lab/bench/gemm.py --versions 8,10,20,21,22 --json "$OUT/cublas/gemm.json" > "$OUT/cublas/gemm.md" 2>&1
        echo "gemm exit $?"; grep "^|" "$OUT/cublas/gemm.md"
        timeout 200 $py lab/bench/step_time.py --sizes 12M 120M --recipe bf16w cublas-bf16 cublas-fp32 --json "$OUT/cublas/step.json" \
            > "$OUT/cublas/step.txt" 2>&1; echo "step exit $?"; grep -v '^{' "$OUT/cublas/step.txt"
        rm -rf $tmp/lt_graph $tmp/lt_eager
        for mode in graph eager; do
          timeout 120 $py -m andrea_numba.train --size 12M --steps 30 --precision bf16 --products cublas --out $tmp/lt_$mode \
              --log-every 10 $([ $mode = eager ] && echo --no-graph) > "$OUT/cublas/train_$mode.txt" 2>&1
          echo "train $mode exit $?"; grep "products:\|launches:\|step *30" "$OUT/cublas/train_$mode.txt" | head -4
        done
        $py - "$tmp" > "$OUT/cublas/train_same.json" <<'PY'
import hashlib, json, sys
from andrea_numba.runlog import read_loss
key = lambda d: [(r["step"], r["train_loss"], r.get("val_loss"), r["grad_norm"]) for r in read_loss(d)]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
T = sys.argv[1]
print(json.dumps({"losses_identical": key(f"{T}/lt_graph") == key(f"{T}/lt_eager"), "steps": len(key(f"{T}/lt_graph")),
                  "checkpoint_identical": sha(f"{T}/lt_graph/checkpoint.bin") == sha(f"{T}/lt_eager/checkpoint.bin"),
                  "state": json.load(open(f"{T}/lt_graph/.state.json")).get("cublaslt_version")}))
PY
        cat "$OUT/cublas/train_same.json" ;;
    mm12) # matmul v12 (bf16 shared tiles, ldmatrix fragments; kernels/half_tile.py): the harness on the
        # three product cases at 12M and 120M at once (against the twin on bf16-rounded inputs, and within
        # the rounding bound of the fp32 twin), then v8, v10 and v12 beside cuBLAS SGEMM and PyTorch's bf16
        # matmul (the default tiles), then v12 at every declared tile (--blocks: the fastest shown)
        mkdir -p "$OUT/mm12"
        for size in 12M 120M; do
          timeout 300 $py -m lab.check --size $size --seed 163 --ops-only --op matmul --op "matmul a@b^T" \
              --op "matmul a^T@b +=" --version 12 --json > "$OUT/mm12/check_$size.json" 2> "$OUT/mm12/check_$size.err" &
        done
        wait
        for size in 12M 120M; do echo "mm12 check $size: $(tail -1 "$OUT/mm12/check_$size.err")"; disagree "$OUT/mm12/check_$size.json"; done
        timeout 240 $py lab/bench/gemm.py --versions 8,10,12 --json "$OUT/mm12/gemm.json" > "$OUT/mm12/gemm.md" 2> "$OUT/mm12/gemm.err"
        echo "gemm exit $?"; grep "^|" "$OUT/mm12/gemm.md"; tail -3 "$OUT/mm12/gemm.err"
        timeout 240 $py lab/bench/gemm.py --versions 12 --blocks --json "$OUT/mm12/gemm_blocks.json" > "$OUT/mm12/gemm_blocks.md" \
            2> "$OUT/mm12/gemm_blocks.err"
        echo "gemm --blocks exit $?"; grep "^|" "$OUT/mm12/gemm_blocks.md"; tail -3 "$OUT/mm12/gemm_blocks.err" ;;
    mm13) # matmul v13 (kernels/half_tile.py: bf16 copies by k_round_bf16_v1, cp.async into a ring of 3-4
        # shared stages, v12's ldmatrix/mma stage): the harness on the three product cases at 12M and 120M
        # (--compile-workers 2: its kernels compiled ahead), then v12 and v13 side by side (the default
        # tiles), then v13 at every declared tile (--blocks: the fastest shown)
        mkdir -p "$OUT/mm13"
        for size in 12M 120M; do
          timeout 300 $py -m lab.check --size $size --seed 167 --ops-only --op matmul --op "matmul a@b^T" \
              --op "matmul a^T@b +=" --version 13 --compile-workers 2 --json > "$OUT/mm13/check_$size.json" \
              2> "$OUT/mm13/check_$size.err"
          echo "mm13 check $size exit $?: $(tail -1 "$OUT/mm13/check_$size.err")"; disagree "$OUT/mm13/check_$size.json"
        done
        timeout 240 $py lab/bench/gemm.py --versions 12,13 --json "$OUT/mm13/gemm.json" > "$OUT/mm13/gemm.md" 2> "$OUT/mm13/gemm.err"
        echo "gemm exit $?"; grep "^|" "$OUT/mm13/gemm.md"; tail -3 "$OUT/mm13/gemm.err"
        timeout 240 $py lab/bench/gemm.py --versions 13 --blocks --json "$OUT/mm13/gemm_blocks.json" > "$OUT/mm13/gemm_blocks.md" \
            2> "$OUT/mm13/gemm_blocks.err"
        echo "gemm --blocks exit $?"; grep "^|" "$OUT/mm13/gemm_blocks.md"; tail -3 "$OUT/mm13/gemm_blocks.err" ;;
    quality) # training quality: 12M for QUALITY_STEPS (2000) steps in fp32, bf16 and fp16,
        # the validation losses side by side and plotted (lab/bench/precision_runs.py), into $OUT/quality/
        # the three at once on the GPU (--parallel: the same losses as one after another);
        # QUALITY_PRODUCTS=cublas trains bf16 and fp16 with cuBLASLt's products
        timeout ${QUALITY_TIMEOUT:-560} $py lab/bench/precision_runs.py --out $tmp/quality --size 12M --steps "${QUALITY_STEPS:-2000}" \
            --precisions fp32,bf16,fp16 --parallel --products "${QUALITY_PRODUCTS:-numba}" > "$OUT/quality.txt" 2>&1
        echo "quality exit $?"; grep "^|" "$OUT/quality.txt" | tail -4
        mkdir -p "$OUT/quality"; cp $tmp/quality/precision_runs.* "$OUT/quality/"
        grep "loss scale" "$OUT/quality.txt" | head -5 ;;
    flash8) compare_versions flash8 attn_flash 83 300 "5 7 8" --flash-version "5 7 8" ;;   # flash v7 (indices >= 0), v8 (longest tiles first) against v5
    flash9-mlp12) # flash v9 (D in the dq kernel), mlp v11 (C-wide products split over K) and v12 (128-bit GELU
        # passes), loss_fwd v9 (softmax rows on fewer threads): the same bits where they claim them,
        # the harness at 12M, their kernel tables at 12M, the whole model at 12M with the engine's
        mkdir -p "$OUT/flash9-mlp12"
        for pair in "attn_flash 5 9" "attn_flash 8 9" "mlp 11 12"; do set -- $pair
          timeout 90 $py lab/bench/same_bits.py --size 12M --op $1 --versions $2 $3 --json "$OUT/flash9-mlp12/bits_$1_$2_$3.json" \
              > "$OUT/flash9-mlp12/bits_$1_$2_$3.txt" 2>&1; echo "same_bits $pair exit $?"; tail -1 "$OUT/flash9-mlp12/bits_$1_$2_$3.txt"; done
        timeout 200 $py -m lab.check --size 12M --seed 89 --ops-only --op mlp --op loss --op attn_flash \
            --version 9 --version 11 --version 12 --json > "$OUT/flash9-mlp12/check_12M.json" 2> "$OUT/flash9-mlp12/check_12M.err"
        echo "flash9-mlp12 check 12M exit $?"; tail -1 "$OUT/flash9-mlp12/check_12M.err"; disagree "$OUT/flash9-mlp12/check_12M.json"
        timeout 150 $py lab/bench/kernels.py mlp --sizes 12M --version 9 --version 11 --version 12 --markdown "$OUT/flash9-mlp12/mlp.md" \
            > "$OUT/flash9-mlp12/mlp.txt" 2>&1; echo "kernels mlp exit $?"; grep "^|" "$OUT/flash9-mlp12/mlp.md"
        timeout 100 $py lab/bench/kernels.py loss --sizes 12M --version 7 --version 9 --markdown "$OUT/flash9-mlp12/loss.md" \
            > "$OUT/flash9-mlp12/loss.txt" 2>&1; echo "kernels loss exit $?"; grep "^|" "$OUT/flash9-mlp12/loss.md"
        timeout 150 $py -m lab.check --size 12M --seed 97 --model-only --json > "$OUT/flash9-mlp12/model_12M.json" \
            2> "$OUT/flash9-mlp12/model_12M.err"; echo "model 12M exit $?"; tail -1 "$OUT/flash9-mlp12/model_12M.err"; disagree "$OUT/flash9-mlp12/model_12M.json" ;;
    simt2) # the whole model with the engine's kernels; matmul v9 (SIMT
           # tiles) against v3 and cuBLAS; the step with fp32, simt and simt2 products; the harness
           # on the simt2 linear ops at 12M
        mkdir -p "$OUT/simt2"
        check_model 43; mv "$OUT"/model_* "$OUT/simt2/"
        timeout 200 $py lab/bench/gemm.py --versions 3,9 --blocks --json "$OUT/simt2/gemm.json" > "$OUT/simt2/gemm.md" 2>&1
        echo "gemm exit $?"; grep "^|" "$OUT/simt2/gemm.md"
        timeout 220 $py lab/bench/step_time.py --sizes 12M 120M --recipe fp32 simt2 simt --json "$OUT/simt2/step.json" \
            > "$OUT/simt2/step.txt" 2>&1
        echo "step exit $?"; grep -v '^{' "$OUT/simt2/step.txt"
        timeout 150 $py -m lab.check --size 12M --seed 47 --ops-only --op attn_qkv --op attn_out --op mlp --op loss \
            --op matmul --op "matmul a@b^T" --op "matmul a^T@b +=" --version 8 --version 9 --version 10 --json \
            > "$OUT/simt2/check_12M.json" 2> "$OUT/simt2/check_12M.err"
        echo "simt2 check 12M exit $?"; tail -1 "$OUT/simt2/check_12M.err"; disagree "$OUT/simt2/check_12M.json" ;;
    model) check_model 14 ;;             # the whole model against the float64 twin (the engine's kernels)
    ln) timeout 300 $py -m lab.check --size 12M --seed 9 --op layernorm --op residual_layernorm --ops-only --json \
            > "$OUT/check_ln_12M.json" 2> "$OUT/check_ln_12M.err"
        echo "ln 12M exit $?"; tail -1 "$OUT/check_ln_12M.err"; disagree "$OUT/check_ln_12M.json" ;;
  esac
  echo "[$s: $(( $(date +%s) - t0 )) s]"
done
for d in graph checks v8 mlp6 mlp9 flash5 flash8 flash9-mlp12 flash10 simt2 embed4 adamw3 ln2; do [ -d "$OUT/$d" ] && tar -C "$OUT" -czf "$OUT/$d.tgz" "$d" && rm -r "$OUT/$d"; done
true
