#!/usr/bin/env bash
# Runs collectives_bench and its Open MPI anchor (mpi_collectives_bench) alternately, RUNS
# times each, at every world size given, and prints the medians side by side with ratios
# (troupe / Open MPI) through bench/compare.py.
#   bash bench/mpi_compare.sh [RUNS=3] [WORLDS="2 4"] [MIN=4096] [MAX=67108864] [--fresh] [--shared] [--pairs]
# --fresh: every rank rewrites each operation's input just before it, on both sides.
# --shared: troupe's tensors lie in shared host memory (collectives_bench --shared);
# Open MPI's buffers stay as they are (its own single copy is process_vm_readv either way).
# --pairs: also each troupe run against the Open MPI run right after it (bench/compare.py
# --pairs time_us): the median of the pairs' ratios and how many pairs troupe won.
# Needs a release build with the bench targets and `scripts/install-deps.sh --bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
worlds=${2:-"2 4"}
min=${3:-4096}
max=${4:-67108864}
extra=""
anchor_extra=""
pairs=""
for opt in "${@:5}"; do
  case $opt in
    --fresh) extra+=" --fresh"; anchor_extra+=" --fresh" ;;
    --shared) extra+=" --shared" ;;
    --pairs) pairs="--pairs time_us" ;;
    *) echo "mpi_compare: unknown option '$opt' (--fresh, --shared or --pairs)" >&2; exit 2 ;;
  esac
done
bin=build/release/bench
ops=${OPS:-allreduce,broadcast,allgather,reduce_scatter}
for f in "$bin/collectives_bench" "$bin/mpi_collectives_bench"; do
  [[ -x $f ]] || { echo "mpi_compare: $f is missing; build the release preset after" \
    "'bash scripts/install-deps.sh --bench'" >&2; exit 1; }
done
# The machine's phase, before and after the tables: Open MPI's 4 KiB allgather at world 2
# moves between about 0.4 and 2 us on the same 2-vCPU VM within an hour, and the tables'
# ratios with it. The fast phase is the two vCPUs sharing one core (core_sharing_bench:
# a copy on both at once takes up to twice its time alone), where lines pass between them
# at once and large copies slow down (bench/RESULTS.md, the twenty-first Open MPI entry).
noise_check() {
  local t
  t=$(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
        "$bin/mpi_collectives_bench" --ops allgather --min 4096 --max 4096 --iters 20000 |
        sed -n 's/.*"time_us": \([0-9.]*\).*/\1/p')
  echo "# $1: Open MPI's 4 KiB allgather at world 2 took ${t:-?} us ($(date -u +%H:%M:%S) UTC)"
  if [[ -x $bin/core_sharing_bench ]]; then
    echo "# $1: $("$bin/core_sharing_bench" 2>&1 || true)"
  fi
}
noise_check "noise check before"
for w in $worlds; do
  echo "## world $w"
  /usr/bin/python3 bench/compare.py --runs "$runs" $pairs \
    --troupe "$bin/collectives_bench --world $w --ops $ops --min $min --max $max --json$extra" \
    --anchor "mpirun --allow-run-as-root --oversubscribe --bind-to none -np $w $bin/mpi_collectives_bench --ops $ops --min $min --max $max$anchor_extra"
done
noise_check "noise check after"
