# Shared by the bench/gpu_*.sh session scripts (sourced): the output folder, the Python to run,
# the summary of a harness result file, and the whole-model check.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=python3

disagree() {     # rows in a check's JSON file, and the first rows that disagree
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); bad=[r for r in d['results'] if not r['ok']]; print(len(d['results']), 'rows,', len(bad), 'disagree'); [print(r) for r in bad[:8]]" "$1"
}

check_model() {  # check_model SEED: the whole model against the float64 twin at 12M and 120M
  local size
  for size in 12M 120M; do
    timeout 150 $py -m andrea_numba.check --size $size --seed "$1" --model-only --json > "$OUT/model_$size.json" \
        2> "$OUT/model_$size.err"
    echo "model $size exit $?"; tail -1 "$OUT/model_$size.err"; disagree "$OUT/model_$size.json"
  done
}
