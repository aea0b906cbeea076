#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test:
#   1. the release build, whole suite (GPU tests report themselves skipped without a GPU);
#   2. the AddressSanitizer + UndefinedBehaviorSanitizer build, whole suite;
#   3. the ThreadSanitizer build of the suites labelled 'tsan' (concurrent code), and those
#      suites run;
#   4. the libFuzzer targets (clang, tests/fuzz/libfuzzer), each for TROUPE_FUZZ_SECONDS
#      (default 20), printing the inputs each executed.
# TROUPE_TEST_QUICK=1 runs step 1 only. TROUPE_TEST_JOBS sets how many tests run at once
# (default: twice the CPUs, at most 8; most tests wait on processes, sockets and
# timeouts, see docs/building.md); the fuzz targets run one per CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

cpus=$(nproc)
jobs=${TROUPE_TEST_JOBS:-$((2 * cpus < 8 ? 2 * cpus : 8))}
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

  echo "== tests: fuzz (libFuzzer)"
  cmake -S tests/fuzz/libfuzzer -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 \
    -DTROUPE_FUZZ_SECONDS="${TROUPE_FUZZ_SECONDS:-20}" > build/fuzz.configure.log 2>&1 ||
    { cat build/fuzz.configure.log; exit 1; }
  cmake --build build/fuzz -j "${TROUPE_BUILD_JOBS:-$(nproc)}"
  ctest --test-dir build/fuzz --output-on-failure -j "$cpus"
  echo "inputs executed per target:"
  grep -E "^[0-9]+/[0-9]+ Testing: |^Done [0-9]+ runs" build/fuzz/Testing/Temporary/LastTest.log
fi
