#!/usr/bin/env bash
# The Shakespeare recipe on a 2-GPU machine, in three steps that each fit a 10-minute command while
# the trainers run on in their own process sessions (setsid) between them:
#
#   bash lab/bench/gpu_recipe.sh start      # data; GPU 0: the recipe at 4,000 steps;
#                                       # GPU 1: harness at 12M and 120M, a SIGTERM/resume check with
#                                       # dropout, then the recipe at 3,000 steps
#   bash lab/bench/gpu_recipe.sh wait N     # print progress every 60 s for N seconds
#   bash lab/bench/gpu_recipe.sh collect    # wait for both GPUs, copy logs and plots to $OUT
#
# Run with PYTHONPATH set up as the README says (the collect step samples from best.bin).
# The corpus comes from `data download shakespeare` (or, without network, from .corpus/shakespeare.txt
# through a file:// address; the sha256 is the registry's either way). Run files stay in $tmp/recipe.
WHAT=recipe; source "$(dirname "$0")/gpu_lib.sh"      # OUT, tmp, py
R=$tmp/recipe; mkdir -p "$R"
CFG=configs/ANDREA-12M-SHAKESPEARE.json

gpu1_jobs() {
    echo "== agreement harness, 12M (every op, the whole model with dropout)"
    $py -m lab.check --size 12M --seed 3 --json > $R/check_12M.json 2> $R/check_12M.err; echo "exit $?"
    echo "== agreement harness, 120M (attention and dropout)"
    $py -m lab.check --size 120M --seed 3 --op attn --op dropout --json > $R/check_120M.json \
        2> $R/check_120M.err; echo "exit $?"
    echo "== SIGTERM and resume with dropout: run a (60 steps) against run b (SIGTERM after 30, --resume)"
    local args="--config $CFG --steps 60 --log-every 10"
    $py -m andrea_numba.train $args --out $R/a > $R/resume_a.log 2>&1; echo "a exit $?"
    $py -m andrea_numba.train $args --out $R/b > $R/resume_b1.log 2>&1 &
    local pid=$!
    until [ -f $R/b/.loss.json ] && [ "$(wc -l < $R/b/.loss.json)" -ge 30 ]; do
        kill -0 $pid 2> /dev/null || break; sleep 0.1
    done
    kill -TERM $pid; wait $pid; echo "b (SIGTERM) exit $?"
    $py -m andrea_numba.train --resume $R/b > $R/resume_b2.log 2>&1; echo "b (resume) exit $?"
    $py - "$R" > $R/resume_check.json <<'PY'
import hashlib, json, os, sys
from andrea_numba.runlog import read_loss
R = sys.argv[1]
key = lambda d: [(r["step"], r["train_loss"], r.get("val_loss"), r["lr"], r["grad_norm"]) for r in read_loss(d)]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
a, b = key(f"{R}/a"), key(f"{R}/b")
res = {"steps_a": len(a), "steps_b": len(b), "loss_json_identical": a == b}
for f in ("checkpoint.bin", "best.bin"):
    if not (os.path.exists(f"{R}/a/{f}") and os.path.exists(f"{R}/b/{f}")):
        res[f] = "missing"
        continue
    res[f] = {"a": sha(f"{R}/a/{f}"), "b": sha(f"{R}/b/{f}")}
    res[f]["identical"] = res[f]["a"] == res[f]["b"]
print(json.dumps(res, indent=1))
PY
    cat $R/resume_check.json
    echo "== the recipe at 3,000 steps"
    $py -m andrea_numba.train --config $CFG --steps 3000 --out $R/short --log-every 100 > $R/short.log 2>&1
    echo "short exit $?"
}

case "${1:-}" in
start)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    if [ -f .corpus/shakespeare.txt ]; then
        $py -m andrea_numba.data download shakespeare --out data/shakespeare --no-prepare \
            --url "file://$PWD/.corpus/shakespeare.txt"
    else
        $py -m andrea_numba.data download shakespeare --out data/shakespeare --no-prepare
    fi
    sha256sum data/shakespeare/input.txt
    date +%s > $R/t0
    CUDA_VISIBLE_DEVICES=0 setsid nohup bash -c "$py -m andrea_numba.train --config $CFG --steps 4000 --out $R/full \
        --log-every 100; echo \"full exit \$?\"" > $R/full.log 2>&1 < /dev/null &
    export -f gpu1_jobs; export R py CFG
    CUDA_VISIBLE_DEVICES=1 setsid nohup bash -c gpu1_jobs > $R/gpu1.log 2>&1 < /dev/null &
    sleep 90; tail -3 $R/full.log; tail -3 $R/gpu1.log
    ;;
wait)
    end=$(( $(date +%s) + ${2:-540} ))
    while [ "$(date +%s)" -lt "$end" ]; do
        sleep 60; echo "--- $(( $(date +%s) - $(cat $R/t0) )) s"; tail -1 $R/full.log; tail -1 $R/gpu1.log
        [ -f $R/short.log ] && tail -1 $R/short.log
        grep -q "full exit" $R/full.log && grep -q "short exit" $R/gpu1.log && break
    done
    ;;
collect)
    end=$(( $(date +%s) + ${2:-500} ))
    until { grep -q "full exit" $R/full.log && grep -q "short exit" $R/gpu1.log; } || [ "$(date +%s)" -ge "$end" ]; do
        sleep 20
    done
    tail -4 $R/full.log; tail -4 $R/short.log 2>/dev/null
    S=$R/out; rm -rf $S; mkdir -p $S/checks        # $OUT takes 8 files: everything goes into one archive
    for run in full short; do
        [ -d $R/$run ] || continue
        mkdir -p "$S/$run"
        cp $R/$run/.loss.json $R/$run/.state.json $R/$run/.samples.json "$S/$run/"   # lab/bench/recipe_report.py reads these
        cp $R/$run.log "$S/$run/train.log"
        $py -m andrea_numba.plot $R/$run --out "$S/$run/loss.png" > /dev/null 2>&1
        $py -m andrea_numba.sample $R/$run --best --prompt "ROMEO:" --tokens 300 --seed 1 > "$S/$run/sample_best.txt" 2>&1
    done
    cp $R/gpu1.log $R/check_*.json $R/check_*.err $R/resume_*.log $R/resume_check.json "$S/checks/" 2>/dev/null
    $py lab/bench/recipe_report.py $S/full $S/short --labels "4,000 steps" "3,000 steps" --png $S/recipe.png \
        --md $S/recipe.md 2>&1 | tail -4
    tar czf "$OUT/recipe.tgz" -C $S .
    ls -la "$OUT"
    ;;
*)
    echo "usage: bash lab/bench/gpu_recipe.sh start | wait [SECONDS] | collect [SECONDS]"; exit 2 ;;
esac
