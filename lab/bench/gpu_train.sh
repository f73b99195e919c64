#!/usr/bin/env bash
# Training on the GPU: the agreement harness at 12M, a SIGTERM/resume
# bit-exactness check at 12M, and 50 steps of 120M with its memory plan against the measured
# peak. Writes what it measured to $OUT (run files stay in $tmp/runs: checkpoints are large).
#   bash lab/bench/gpu_train.sh [parts...]   # parts: check resume 120M (default all three)
WHAT=train; source "$(dirname "$0")/gpu_lib.sh"      # OUT, tmp, py
R=$tmp/runs; mkdir -p "$R"
parts=" ${*:-check resume 120M} "
want() { [[ $parts == *" $1 "* ]]; }

if want check; then
echo "== agreement harness, 12M"
$py -m lab.check --size 12M --seed 2 --json > "$OUT/check_12M.json" 2> "$OUT/check_12M.err"; echo "exit $?"
fi

if want resume; then
echo "== 12M: run a (80 steps) and run b (SIGTERM after 40 logged steps, then --resume)"
$py -m andrea_numba.train --size 12M --microbatches 1 --steps 80 --out $R/a --log-every 20 > "$OUT/resume_a.log" 2>&1
echo "a exit $?"
$py -m andrea_numba.train --size 12M --microbatches 1 --steps 80 --out $R/b --log-every 20 > "$OUT/resume_b1.log" 2>&1 &
pid=$!
until [ -f $R/b/.loss.json ] && [ "$(wc -l < $R/b/.loss.json)" -ge 40 ]; do sleep 0.1; done
kill -TERM $pid; wait $pid; echo "b (SIGTERM) exit $?"
$py -m andrea_numba.train --resume $R/b > "$OUT/resume_b2.log" 2>&1; echo "b (resume) exit $?"
$py - "$R" > "$OUT/resume_check.json" <<'PY'
import hashlib, json, sys
from andrea_numba.runlog import read_loss
R = sys.argv[1]
key = lambda d: [(r["step"], r["train_loss"], r.get("val_loss"), r["lr"], r["grad_norm"]) for r in read_loss(d)]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
a, b = key(f"{R}/a"), key(f"{R}/b")
res = {"steps_a": len(a), "steps_b": len(b), "loss_json_identical": a == b,
       "checkpoint_sha256_a": sha(f"{R}/a/checkpoint.bin"), "checkpoint_sha256_b": sha(f"{R}/b/checkpoint.bin")}
res["checkpoints_identical"] = res["checkpoint_sha256_a"] == res["checkpoint_sha256_b"]
print(json.dumps(res, indent=1))
PY
cat "$OUT/resume_check.json"
grep -h "stopped by signal\|resumed from" "$OUT"/resume_b*.log
fi

if want 120M; then
echo "== 120M: 50 steps, memory sampled by nvidia-smi every 200 ms"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 200 > "$OUT/smi_120M.csv" &
smi=$!
$py -m andrea_numba.train --size 120M --microbatches 1 --steps 50 --out $R/c --log-every 10 > "$OUT/train_120M.log" 2>&1
echo "120M exit $?"
kill $smi
cp $R/c/.loss.json "$OUT/loss_120M.json"; cp $R/c/.state.json "$OUT/state_120M.json"; cp $R/c/.samples.json "$OUT/samples_120M.json"
tail -5 "$OUT/train_120M.log"
sort -n "$OUT/smi_120M.csv" | tail -1 | sed 's/^/peak MiB used, total: /'
fi
