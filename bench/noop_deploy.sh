#!/usr/bin/env bash
# No-op re-runs of deploy.yml on already deployed sandbox hosts (as root, under the sandbox lock): this tree
# against BEFORE (another checkout, e.g. `git worktree add --detach /tmp/before <commit>`), interleaved REPS
# times, and this tree a second time in each round (the A/A line). Both trees run this tree's core
# (PYTHONPATH=src), so the wheelhouse they ship is the same and only the playbooks differ; BEFORE's .cache
# should be a link to this tree's .cache for the same reason.
# Usage: bash bench/noop_deploy.sh BEFORE_TREE [REPS] [INVENTORY]  -> one line per run, then median (min - max).
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$PWD; BEFORE=$(realpath "$1"); REPS=${2:-3}; INV=$(realpath "${3:-inventory/sandbox}")
LOG=/tmp/specdeploy-noop-bench.log; RES=$(mktemp)
run() {  # label tree
  local s e
  s=$(date +%s.%N)
  (cd "$2" && PYTHONPATH=$HERE/src ansible-playbook -i "$INV" ansible/deploy.yml) > "$LOG" 2>&1 \
    || { tail -30 "$LOG"; exit 1; }
  e=$(date +%s.%N)
  changed=$(grep -A9 "PLAY RECAP" "$LOG" | grep -o 'changed=[0-9]*' | tr '\n' ' ')
  python3 -c "import sys; print(f'{sys.argv[1]:8} {float(sys.argv[3]) - float(sys.argv[2]):6.1f} s  {sys.argv[4]}')" \
    "$1" "$s" "$e" "$changed" | tee -a "$RES"
}
for _ in $(seq "$REPS"); do
  run before "$BEFORE"; run after "$HERE"; run after-aa "$HERE"
done
python3 - "$RES" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
for label in ("before", "after", "after-aa"):
    t = [float(r[1]) for r in rows if r[0] == label]
    print(f"{label:8} median {statistics.median(t):5.1f} s  ({min(t):.1f} - {max(t):.1f} s, n={len(t)})")
PY
