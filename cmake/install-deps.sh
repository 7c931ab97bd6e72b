#!/usr/bin/env bash
# Installs the Debian packages uattn builds and tests with, only those that are missing.
# Called by `make`; safe to run again (it does nothing when all are present).
set -euo pipefail
packages=(build-essential cmake pkg-config libxsmm-dev libhwloc-dev hwloc libcriterion-dev libcjson-dev
          python3-numpy gnuplot-nox)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "uattn: installing missing packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "uattn: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
