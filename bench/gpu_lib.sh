# Shared by the bench/gpu_*.sh session scripts (sourced): the output folder, the Python to run,
# and the summary of a harness result file.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=python3

disagree() {     # rows in a check's JSON file, and the first rows that disagree
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); bad=[r for r in d['results'] if not r['ok']]; print(len(d['results']), 'rows,', len(bad), 'disagree'); [print(r) for r in bad[:8]]" "$1"
}
