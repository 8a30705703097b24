#!/usr/bin/env bash
# Wall time of a deploy to fresh sandbox hosts and of a no-op re-run (as root, after scripts/setup.sh).
# Usage: bash bench/sandbox_deploy.sh [HOSTS]   -> prints one line per step; the rootfs cache is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}
t() { local s=$(date +%s.%N); "$@" > /tmp/specdeploy-bench.log 2>&1 || { tail -20 /tmp/specdeploy-bench.log; exit 1; }; \
      python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):7.1f} s')" "$s" "$(date +%s.%N)"; }
specdeploy sandbox down >/dev/null 2>&1 || true
printf 'sandbox up (%s hosts, rootfs cached)  ' "$N"; t specdeploy sandbox up --hosts "$N"
printf 'deploy.yml, fresh hosts            '; t ansible-playbook -i inventory/sandbox ansible/deploy.yml
printf 'deploy.yml, no-op re-run           '; t ansible-playbook -i inventory/sandbox ansible/deploy.yml
grep -A3 "PLAY RECAP" /tmp/specdeploy-bench.log
