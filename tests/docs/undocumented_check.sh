#!/usr/bin/env bash
# Builds the API reference as the `docs` target does (into a folder of its own) and fails
# on every Doxygen warning about an undocumented entity in the headers whose every public
# function must carry a `///` comment: core/*.hpp, rpc/agent.hpp, store/store.hpp and
# collectives/process_group.hpp.
#   undocumented_check.sh <doxygen> <Doxyfile> <source dir> <output dir>
set -euo pipefail
doxygen=$1 doxyfile=$2 src=$3 out=$4
if [[ ! -x "$doxygen" ]]; then
  echo "doxygen was not found when CMake configured; install it (scripts/install-deps.sh)" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
# The configured Doxyfile, with this test's output folder and log.
{ cat "$doxyfile"; echo "OUTPUT_DIRECTORY = $out"; echo "WARN_LOGFILE = $out/warnings.log"; } |
  timeout 240 "$doxygen" - >"$out/doxygen.out" 2>&1 ||
  { cat "$out/doxygen.out"; echo "doxygen failed" >&2; exit 1; }
[[ -f "$out/html/index.html" ]] || { echo "doxygen wrote no $out/html/index.html" >&2; exit 1; }
scope="^$src/(core/[^/]+\.hpp|membership/[^/]+\.hpp|rpc/agent\.hpp|store/store\.hpp|collectives/process_group\.hpp):"
missing=$(grep -E "$scope" "$out/warnings.log" | grep "is not documented" | sort -u || true)
if [[ -n "$missing" ]]; then
  echo "$missing"
  echo "$(wc -l <<<"$missing") undocumented public entities above: add a /// comment to each" >&2
  exit 1
fi
echo "every public entity of core/, membership/, rpc/agent.hpp, store/store.hpp and collectives/process_group.hpp is documented"
echo "($(wc -l <"$out/warnings.log") lines of other Doxygen warnings in $out/warnings.log)"
