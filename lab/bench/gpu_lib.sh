# Shared by the lab/bench/gpu_*.sh scripts (sourced): the output folder, the scratch folder, the Python
# to run, the summary of a harness result file, the whole-model check, the harness on one op at both
# sizes and the side-by-side of versions.
#   OUT  the results, by default results/DATE-GPU-WHAT (results/2026-12-03-h200-fp8-step: WHAT is set by
#        the script that sources this, the GPU is the second word of nvidia-smi's name); exported, so a
#        script that runs itself again for one of its steps writes into the same folder
#   tmp  run directories and other scratch that is not a result (TMPDIR, else /tmp)
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | awk '{print tolower($2)}')
export OUT=${OUT:-results/$(date +%F)-${gpu:-gpu}-${WHAT:-run}}; mkdir -p "$OUT"
tmp=${TMPDIR:-/tmp}
export PYTHONUNBUFFERED=1
py=python3

disagree() {     # rows in a check's JSON file, and the first rows that disagree (one line if it is empty:
  # the check stopped, or ran past its time limit, before writing it)
  [ -s "$1" ] || { echo "no rows: $(basename "$1") is empty (see its .err)"; return; }
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); bad=[r for r in d['results'] if not r['ok']]; print(len(d['results']), 'rows,', len(bad), 'disagree'); [print(r) for r in bad[:8]]" "$1"
}

check_model() {  # check_model SEED: the whole model against the float64 twin at 12M and 120M
  local size
  for size in 12M 120M; do
    timeout 150 $py -m lab.check --size $size --seed "$1" --model-only --json > "$OUT/model_$size.json" \
        2> "$OUT/model_$size.err"
    echo "model $size exit $?"; tail -1 "$OUT/model_$size.err"; disagree "$OUT/model_$size.json"
  done
}

check_op_sizes() {    # check_op_sizes DIR OP SEED [check flags...]: the harness on OP at 12M and 120M, into
  # DIR/check_12M.json and DIR/check_120M.json (and .err), with the rows that disagree
  local dir=$1 op=$2 seed=$3 size; shift 3
  mkdir -p "$dir"
  for size in 12M 120M; do
    timeout 150 $py -m lab.check --size $size --seed "$seed" --ops-only --op "$op" "$@" \
        --json > "$dir/check_$size.json" 2> "$dir/check_$size.err"
    echo "$(basename "$dir") check $size exit $?"; tail -1 "$dir/check_$size.err"; disagree "$dir/check_$size.json"
  done
}

compare_versions() {  # compare_versions TAG OP SEED SECONDS "VERSIONS" STEP_FLAG "STEP_VALUES": versions of
  # one op side by side: the harness at 12M and 120M (into $OUT/TAG/), lab/bench/kernels.py's table and
  # the step with STEP_FLAG STEP_VALUES (--mlp-version 9, --flash-version 3 5 6); SECONDS bounds
  # the table and the step (every file into $OUT/TAG/)
  local tag=$1 op=$2 seed=$3 t=$4 versions=$5 flag=$6 values=$7 size v vflags=()
  for v in $versions; do vflags+=(--version "$v"); done
  check_op_sizes "$OUT/$tag" "$op" "$seed" "${vflags[@]}"
  timeout "$t" $py lab/bench/kernels.py "$op" --sizes 12M,120M "${vflags[@]}" --markdown "$OUT/$tag/kernels.md" \
      > "$OUT/$tag/kernels.txt" 2>&1; echo "kernels $op exit $?"; grep "^|" "$OUT/$tag/kernels.md"
  # shellcheck disable=SC2086  (the values are words)
  timeout "$t" $py lab/bench/step_time.py --sizes 12M 120M $flag $values --json "$OUT/$tag/step.json" > "$OUT/$tag/step.txt" 2>&1
  echo "step $flag $values exit $?"; grep -v '^{' "$OUT/$tag/step.txt"
}
