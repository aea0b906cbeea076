#!/usr/bin/env bash
# Same-run A/B: the benchmarks of this tree against those of an earlier commit, run
# alternately on the same machine in the same minutes, medians and ratios (now / before).
#   bash bench/ab_compare.sh [BASE=HEAD~1] [RUNS=5] [COLLECTIVES_OPTIONS]
# It measures what a change to the house must keep (docs/architecture.md): rpc_bench's
# round-trip p50, async calls/s and 16 MiB echo, and collectives_bench at world 2. BASE is
# built once in build/ab/<commit> (its sources exported to build/ab/src), this tree in
# build/ab/tree, both with the same flags (release, no CUDA, no tests). Ratios under 1 for
# times and over 1 for rates mean this tree is faster. Machines are noisy: read the
# medians, not one run; operations of a few microseconds need more runs (RUNS=15).
#   bash bench/ab_compare.sh BASE RUNS "--ops allreduce --max 262144"   # collectives only
# A third argument runs only collectives_bench, with those options added.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(git rev-parse --verify "${1:-HEAD~1}^{commit}") ||
  { echo "ab_compare: '${1:-HEAD~1}' is not a commit; give a commit, tag or branch" >&2; exit 2; }
runs=${2:-5}
coll_extra=${3:-}
jobs=${TROUPE_BUILD_JOBS:-$(nproc)}

# Both sides are built the same way (release flags, no CUDA, no tests), so that only the
# code differs: this tree in build/ab/tree, BASE in build/ab/<commit>.
configure() {  # source dir, binary dir
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DTROUPE_BUILD_TESTS=OFF \
    -DTROUPE_BUILD_EXAMPLES=OFF -DTROUPE_BUILD_BENCH=ON -DTROUPE_WITH_CUDA=OFF \
    > "$2.configure.log" 2>&1 || { cat "$2.configure.log" >&2; exit 1; }
}
short=${base:0:12}
src=build/ab/src/$short
out=build/ab/$short
now=build/ab/tree
mkdir -p build/ab
if [[ ! -x $out/bench/collectives_bench || ! -x $out/bench/rpc_bench ]]; then
  echo "== building the benchmarks of $short in $out" >&2
  if [[ ! -f $src/CMakeLists.txt ]]; then
    rm -rf "$src" && mkdir -p "$src"
    git archive "$base" | tar -x -C "$src"
  fi
  configure "$src" "$out"
  cmake --build "$out" --target rpc_bench collectives_bench -j "$jobs" >&2
fi
echo "== building this tree's benchmarks in $now" >&2
[[ -f $now/build.ninja ]] || configure . "$now"
cmake --build "$now" --target rpc_bench collectives_bench -j "$jobs" >&2

rpc="bench/rpc_bench --iters 3000 --seconds 2 --sizes 16777216"
coll="bench/collectives_bench --world 2 --json $coll_extra"
if [[ -z $coll_extra ]]; then
echo "## rpc_bench: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes') vs $short"
/usr/bin/python3 bench/compare.py --runs "$runs" --labels now,before \
  --troupe "$now/$rpc" --anchor "$out/$rpc"
echo
fi
echo "## collectives_bench --world 2 $coll_extra"
/usr/bin/python3 bench/compare.py --runs "$runs" --labels now,before \
  --troupe "$now/$coll" --anchor "$out/$coll"
