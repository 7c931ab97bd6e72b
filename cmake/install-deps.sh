#!/usr/bin/env bash
# Installs the Debian packages uattn builds and tests with, only those that are missing.
# Called by `make`; safe to run again (it does nothing when all are present).
# With --fuzz: the packages `make fuzz` needs as well, clang and its libFuzzer runtime (libclang_rt.fuzzer,
# in libclang-rt-14-dev on Debian 12), kept apart so that `make test` does not need clang.
set -euo pipefail
packages=(build-essential cmake pkg-config libxsmm-dev libhwloc-dev hwloc libcriterion-dev libcjson-dev
          python3-numpy gnuplot-nox python3-dev python3-pytest clang-format libopenmpi-dev openmpi-bin)
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-14-dev)
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--fuzz]" >&2
  exit 2
fi
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
