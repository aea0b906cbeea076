#!/usr/bin/env bash
# The GPU bundle as a lent device would get it, built and run here: scripts/gpu-bundle.sh
# packs the build's GPU binaries (within 60 MiB), and its run.sh finds CUDA's runtime and
# NCCL, runs every GPU test case and reports each one passed, skipped with its reason, or
# failed. Without a device: nothing fails and the device cases say why they skipped.
#   gpu_bundle_test.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 build=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle_test.XXXXXX")
trap 'rm -rf "$out"' EXIT
failures=0
expect() {  # description, command...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
bash "$src/scripts/gpu-bundle.sh" --no-build --build-dir "$build" --out "$out/bundle" >"$out/bundle.log" 2>&1
expect "the bundle builds from this build" test $? = 0
expect "it holds run.sh, the test binaries and the benchmarks" \
  test -x "$out/bundle/run.sh" -a -x "$out/bundle/tests/collectives_gpu_tests" -a -x "$out/bundle/bench/nccl_bench" \
  -a -x "$out/bundle/tests/rpc_gpu_tests" -a -x "$out/bundle/bench/rpc_gpu_bench"
expect "it fits in 60 MiB" test "$(du -sk "$out/bundle" | cut -f1)" -le $((60 * 1024))
"$out/bundle/run.sh" --tests-only >"$out/run.log" 2>&1
rc=$?
if [[ -e /dev/nvidia0 ]]; then
  expect "on a GPU machine every GPU test case passes" test "$rc" = 0
else
  expect "without a device run.sh fails nothing" test "$rc" = 0
  expect "every device case is reported skipped with its reason" \
    grep -q "^SKIP collectives_gpu_tests: .*(no usable CUDA device" "$out/run.log"
  expect "the RPC GPU cases are there and skipped with their reason" \
    grep -q "^SKIP rpc_gpu_tests: .*(no CUDA device" "$out/run.log"
  expect "no case is reported failed" bash -c "! grep -q '^FAIL' '$out/run.log'"
  expect "the summary counts them" grep -Eq "gpu tests: [0-9]+ passed, 0 failed, [1-9][0-9]* skipped" "$out/run.log"
fi
if ((failures > 0)); then
  cat "$out/bundle.log" "$out/run.log"
  echo "$failures failure(s)"
  exit 1
fi
