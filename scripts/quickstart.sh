#!/usr/bin/env bash
# Fresh machine (as root): install, check the example inventory in seconds, boot two sandbox hosts and deploy
# to them with Ansible. `specdeploy sandbox down` removes the hosts afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== preflight of inventory/example (2x RTX PRO 6000, vLLM 0.16.0 + EAGLE-3)"
specdeploy preflight -i inventory/example
echo "== plan of inventory/example (rendered into out/plan)"
specdeploy plan -i inventory/example --out out/plan
echo "== sandbox: two Debian hosts booted with systemd-nspawn"
specdeploy sandbox up --hosts 2
echo "== deploy: ansible-playbook -i inventory/sandbox ansible/site.yml"
ansible-playbook -i inventory/sandbox ansible/site.yml
echo "== done: engines at http://10.231.1.2:8000 and http://10.231.2.2:8000, router at http://10.231.1.2:30080,"
echo "   Prometheus at http://10.231.1.2:9090. Remove with: specdeploy sandbox down"
