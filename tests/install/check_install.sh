#!/usr/bin/env bash
# usage: check_install.sh BUILD_DIR CONSUMER_SRC WORK_DIR CXX [CXX_FLAGS]
set -euo pipefail
build=$1 consumer=$2 work=$3 cxx=$4 flags=${5:-}
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$flags" \
      -DCMAKE_EXE_LINKER_FLAGS="$flags" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
out=$("$work/build/consumer")
echo "$out"
grep -q "parsed cuda:1" <<<"$out"
grep -q "ddp_spawn starts workers with spawn" <<<"$out"
