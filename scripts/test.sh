#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test:
#   1. the release build, whole suite (GPU tests report themselves skipped without a GPU);
#   2. the AddressSanitizer + UndefinedBehaviorSanitizer build, whole suite;
#   3. the ThreadSanitizer build of the suites labelled 'tsan' (concurrent code), and those
#      suites run.
# TROUPE_TEST_QUICK=1 runs step 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

jobs=${TROUPE_TEST_JOBS:-2}
run_suite() {  # preset, targets to build ("" for all), extra ctest args...
  local preset=$1 targets=$2
  shift 2
  echo "== tests: $preset"
  TROUPE_BUILD_TARGETS=$targets bash scripts/build.sh "$preset"
  ctest --test-dir "build/$preset" --output-on-failure -j "$jobs" "$@"
}

run_suite release ""
if [[ "${TROUPE_TEST_QUICK:-0}" != "1" ]]; then
  run_suite asan ""
  run_suite tsan tsan_suites -L tsan
fi
