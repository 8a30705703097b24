#!/usr/bin/env bash
# Install what specdeploy and its tests need on a fresh Debian/Ubuntu machine (as root, or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  need=()
  for pkg in prometheus debootstrap systemd-container iproute2 rsync openssh-client gpg; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  # The Debian package starts a Prometheus we do not want; tests start their own.
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
python3 -m pip install -q -e '.[test]'
# An editable install leaves specdeploy's modules without bytecode, and where PYTHONDONTWRITEBYTECODE is set every
# process (each CLI call, ansible-playbook and its filters) compiles them again; a wheel install has its bytecode.
# Each .pyc is checked against its source's hash, so an edited module never runs from stale bytecode.
python3 -m compileall -q --invalidation-mode checked-hash src ansible
