#!/usr/bin/env bash
# Installs what troupe needs, by Debian package name (Debian 12). Idempotent: when every
# package is present it only checks and returns.
#   scripts/install-deps.sh --demo    only what the demo build uses (scripts/demo.sh): the
#                                     compiler, CMake and the libraries the libraries link
#   scripts/install-deps.sh           everything to build and test (scripts/test.sh): the
#                                     demo set, doctest, etcd, doxygen, network tools,
#                                     python3-prometheus-client, clang with libFuzzer
#   scripts/install-deps.sh --bench   also the benchmark anchors (PyTorch 1.13: python3-torch;
#                                     Open MPI: openmpi-bin, libopenmpi-dev)
set -euo pipefail

# What `cmake --preset demo` configures and `cmake --build --preset demo` compiles and links.
packages=(
  g++ make ninja-build cmake libcaf-dev libboost-dev libgloo-dev libcli11-dev nlohmann-json3-dev libssl-dev
)
case "${1:-}" in
  --demo) ;;
  "" | --bench)
    # The test suite: doctest, a real etcd, the docs target (doxygen), simulated hosts
    # (iproute2, util-linux's unshare/nsenter, python3), the openssl command for the TLS
    # tests' certificates, a real Prometheus text parser for the metrics endpoint's test
    # (python3-prometheus-client), clang and its libFuzzer runtime for the fuzz pass
    # (tests/fuzz/libfuzzer), clang-format for the format check (scripts/format.sh), lld
    # (it links the test programs three times faster than GNU ld), and the usual developer
    # tools.
    packages+=(
      build-essential git pkg-config ca-certificates python3 procps
      doctest-dev etcd-server etcd-client doxygen iproute2 util-linux openssl
      python3-prometheus-client clang-14 libclang-rt-14-dev clang-format-14 lld
    )
    if [[ "${1:-}" == "--bench" ]]; then
      packages+=(python3-torch openmpi-bin libopenmpi-dev)
    fi
    ;;
  *)
    echo "install-deps: unknown option '$1'; use --demo, --bench or nothing" >&2
    exit 2
    ;;
esac

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
