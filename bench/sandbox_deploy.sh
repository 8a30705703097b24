#!/usr/bin/env bash
# Wall times on fresh sandbox hosts (as root, after scripts/setup.sh; the rootfs cache is kept):
#   - engine image build on the hosts (docker runtime): cold, cached (a re-run), and a rebuild of the engine
#     image alone with the base and stand-in layers cached;
#   - deploy.yml on fresh hosts and its no-op re-run, Docker against venv, interleaved REPS times.
# Usage: bash bench/sandbox_deploy.sh [HOSTS] [REPS] [BUILDS=1]   -> one line per step (BUILDS=0: deploys only).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}; REPS=${2:-2}; BUILDS=${3:-1}
LOG=/tmp/specdeploy-bench.log
t() { local s; s=$(date +%s.%N); "$@" > "$LOG" 2>&1 || { tail -20 "$LOG"; exit 1; }; \
      python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):7.1f} s')" "$s" "$(date +%s.%N)"; }
fresh() { specdeploy sandbox down >/dev/null 2>&1 || true; specdeploy sandbox up --hosts "$N" --runtime "$1" >/dev/null 2>&1; }
on_hosts() { for h in $(specdeploy sandbox status | cut -f2); do
  ssh -i "${SPECDEPLOY_SANDBOX_STATE:-/var/lib/specdeploy-sandbox}/id_ed25519" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
      -o LogLevel=ERROR "root@$h" "$1"; done; }
play() { ansible-playbook -i inventory/sandbox "ansible/$1"; }

if [ "$BUILDS" = 1 ]; then
fresh docker
printf 'build.yml, fresh hosts: base image load, stand-in, engine image (cold)  '; t play build.yml
printf 'build.yml re-run (images cached)                                         '; t play build.yml
TAG=$(specdeploy engine image --engine vllm --version 0.16.0 --field tag)
on_hosts "docker rmi -f $TAG >/dev/null"
printf 'build.yml, engine image rebuilt (base and stand-in cached)               '; t play build.yml
fi
for r in $(seq "$REPS"); do
  for rt in docker venv; do
    fresh "$rt"
    printf 'rep %s %-6s deploy.yml, fresh hosts                 ' "$r" "$rt"; t play deploy.yml
    printf 'rep %s %-6s deploy.yml, no-op re-run                ' "$r" "$rt"; t play deploy.yml
    grep -A"$N" "PLAY RECAP" $LOG | tail -n "$N" | sed 's/^/    /'
  done
done
specdeploy sandbox down >/dev/null 2>&1
