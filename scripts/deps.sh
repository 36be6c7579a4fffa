#!/usr/bin/env bash
# Installs what kiln needs on Debian (run as root). Idempotent: when every
# package is present it does nothing. `--torch` adds python3-torch, needed
# only to regenerate the PyTorch fixtures in tests/reference/.
set -euo pipefail
pkgs=(build-essential pkg-config libdnnl-dev libjansson-dev libopenblas-dev bible-kjv openmpi-bin libopenmpi-dev)
[ "${1:-}" = "--torch" ] && pkgs+=(python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "kiln: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
