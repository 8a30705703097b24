#!/usr/bin/env bash
# Set up, then show what specdeploy would deploy on the example inventory and check it in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
specdeploy plan -i inventory/example --out out/plan
