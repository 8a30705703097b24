#!/bin/sh
# Managed by specdeploy (gpu_host role): disable PCIe ACS redirect above the NVIDIA GPUs, so P2P goes direct.
set -eu
gpus=""
for dev in /sys/bus/pci/devices/*; do
  [ -e "$dev/vendor" ] && [ "$(cat "$dev/vendor")" = "0x10de" ] || continue
  case "$(cat "$dev/class")" in 0x0300*|0x0302*) gpus="$gpus $dev" ;; esac
done
[ -n "$gpus" ] || { echo "no NVIDIA GPU on the PCI bus: nothing to do"; exit 0; }
command -v setpci >/dev/null || { echo "setpci not found (install pciutils)" >&2; exit 1; }
for dev in $gpus; do
  path=$(readlink -f "$dev")
  while path=$(dirname "$path"); [ "${path#/sys/devices/pci}" != "$path" ]; do
    bdf=$(basename "$path")
    case "$bdf" in
      *:*:*.*) setpci -s "$bdf" ECAP_ACS+6.w=0000:000c 2>/dev/null && echo "ACS redirect off: $bdf" || true ;;
    esac
  done
done
