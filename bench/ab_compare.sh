#!/usr/bin/env bash
# Same-run A/B: the benchmarks of this tree against those of an earlier commit, run
# alternately on the same machine in the same minutes, medians and ratios (now / before).
#   bash bench/ab_compare.sh [BASE=HEAD~1] [RUNS=5]
# It measures what a change to the house must keep (docs/architecture.md): rpc_bench's
# round-trip p50, async calls/s and 16 MiB echo, and collectives_bench at world 2. BASE is
# built once, without tests, in build/ab/<commit> (its sources exported to build/ab/src);
# this tree's benchmarks come from build/release. Ratios under 1 for times and over 1 for
# rates mean this tree is faster. Machines are noisy: read the medians, not one run.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(git rev-parse --verify "${1:-HEAD~1}^{commit}") ||
  { echo "ab_compare: '${1:-HEAD~1}' is not a commit; give a commit, tag or branch" >&2; exit 2; }
runs=${2:-5}
now=build/release/bench
for f in rpc_bench collectives_bench; do
  [[ -x $now/$f ]] || { echo "ab_compare: $now/$f is missing; build the release preset" \
    "with benchmarks (cmake --preset release && cmake --build build/release)" >&2; exit 1; }
done

short=${base:0:12}
src=build/ab/src/$short
out=build/ab/$short
if [[ ! -x $out/bench/collectives_bench || ! -x $out/bench/rpc_bench ]]; then
  echo "== building the benchmarks of $short in $out" >&2
  if [[ ! -f $src/CMakeLists.txt ]]; then
    rm -rf "$src" && mkdir -p "$src"
    git archive "$base" | tar -x -C "$src"
  fi
  cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DTROUPE_BUILD_TESTS=OFF \
    -DTROUPE_BUILD_EXAMPLES=OFF -DTROUPE_BUILD_BENCH=ON -DTROUPE_WITH_CUDA=OFF \
    > "$out.configure.log" 2>&1 || { cat "$out.configure.log" >&2; exit 1; }
  cmake --build "$out" --target rpc_bench collectives_bench \
    -j "${TROUPE_BUILD_JOBS:-$(nproc)}" >&2
fi

rpc="bench/rpc_bench --iters 3000 --seconds 2 --sizes 16777216"
coll="bench/collectives_bench --world 2 --json"
echo "## rpc_bench: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes') vs $short"
/usr/bin/python3 bench/compare.py --runs "$runs" --labels now,before \
  --troupe "build/release/$rpc" --anchor "$out/$rpc"
echo
echo "## collectives_bench --world 2"
/usr/bin/python3 bench/compare.py --runs "$runs" --labels now,before \
  --troupe "build/release/$coll" --anchor "$out/$coll"
