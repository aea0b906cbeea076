#!/usr/bin/env bash
# Configures and builds one preset (default: release) into build/<preset>.
#   scripts/build.sh [release|demo|debug|asan|tsan] [extra cmake configure args...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
jobs=${TROUPE_BUILD_JOBS:-$(nproc)}
mkdir -p build
# The presets generate Ninja files, and CMake refuses to configure a folder for another
# generator than the one it was first configured with: a folder configured earlier for make
# has its CMake cache cleared first (its objects are rebuilt).
if [[ -f "build/$preset/CMakeCache.txt" ]] &&
  ! grep -q "^CMAKE_GENERATOR:INTERNAL=Ninja$" "build/$preset/CMakeCache.txt"; then
  echo "build: build/$preset was configured for another generator; the presets use Ninja," \
    "so its CMake cache is cleared and it is configured afresh"
  rm -rf "build/$preset/CMakeCache.txt" "build/$preset/CMakeFiles"
fi
cmake --preset "$preset" "$@" > "build/$preset.configure.log" 2>&1 ||
  { cat "build/$preset.configure.log"; exit 1; }
grep -E "^-- troupe:" "build/$preset.configure.log" || true
# TROUPE_BUILD_TARGETS: build only these targets (space-separated), e.g. tsan_suites.
targets=()
for t in ${TROUPE_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build --preset "$preset" -j "$jobs" "${targets[@]}"
