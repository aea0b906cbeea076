#!/usr/bin/env bash
# Installs everything troupe needs to build and test, by Debian package name (Debian 12).
# Idempotent: when every package is present it only checks and returns.
#   scripts/install-deps.sh           build and test dependencies
#   scripts/install-deps.sh --bench   also the benchmark anchors (PyTorch 1.13: python3-torch;
#                                     Open MPI: openmpi-bin, libopenmpi-dev)
set -euo pipefail

packages=(
  build-essential g++ cmake make git pkg-config ca-certificates python3 procps
  libcaf-dev libboost-dev libboost-filesystem-dev doctest-dev libgloo-dev libssl-dev
  etcd-server etcd-client libcli11-dev nlohmann-json3-dev clang-format
  iproute2 util-linux
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch openmpi-bin libopenmpi-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
