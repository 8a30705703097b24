#!/usr/bin/env bash
# Fresh machine (as root): install, check the example inventory in seconds, boot two sandbox hosts and deploy
# to them with Ansible, in the production runtime: dockerd on each host, engine images built there, engines in
# containers. `specdeploy sandbox down` removes the hosts afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== preflight of inventory/example (2x RTX PRO 6000, vLLM 0.16.0 + EAGLE-3)"
specdeploy preflight -i inventory/example
echo "== plan of inventory/example (rendered into out/plan)"
specdeploy plan -i inventory/example --out out/plan
echo "== sandbox: two Debian hosts booted with systemd-nspawn, running dockerd"
specdeploy sandbox up --hosts 2 --runtime docker
echo "== deploy: ansible-playbook -i inventory/sandbox ansible/site.yml"
ansible-playbook -i inventory/sandbox ansible/site.yml
echo "== engine containers (docker ps on each host)"
for h in $(specdeploy sandbox status | cut -f2); do
  echo "-- $h"
  ssh -i "${SPECDEPLOY_SANDBOX_STATE:-/var/lib/specdeploy-sandbox}/id_ed25519" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
      -o LogLevel=ERROR "root@$h" "docker ps --format '{{.Names}}  {{.Image}}  {{.Status}}'"
done
echo "== done: engines at http://10.231.1.2:8000 and http://10.231.2.2:8000, router at http://10.231.1.2:30080,"
echo "   Prometheus at http://10.231.1.2:9090. Remove with: specdeploy sandbox down"
