#!/usr/bin/env bash
# The cross-host figures: troupe and its anchors between two simulated hosts
# (tests/multihost/sim_hosts.sh: network, UTS, mount and pid namespaces joined by a veth
# bridge), all measured in one run, alternating troupe and anchor for RUNS rounds.
#   - RPC no-op roundtrip and 16 MiB echo: rpc_bench (rank 0 on host0 drives, rank 1 on
#     host1 serves; it also measures a raw TCP ping-pong and echo between the same two
#     processes) against torch.distributed.rpc (TensorPipe, bench/rpc_torch.py); rpc_bench
#     once more with --inline --busy-poll-us 50 (the low-latency settings of RESULTS.md);
#   - allreduce bus bandwidth at world 4, 2 hosts x 2 ranks: collectives_bench (the gloo
#     backend's hierarchical path from 256 KiB) against torch's gloo backend
#     (bench/collectives_torch_gloo.py); also collectives_bench with
#     TROUPE_GLOO_HIERARCHICAL=0 (the flat TCP path) and its two-level prototype
#     (allreduce_hier: public subgroups, shared memory within a host, TCP across);
#   - the same allreduce sizes against Open MPI (bench/mpi_collectives_bench, when built:
#     `scripts/install-deps.sh --bench`), started by mpirun in host0's network and UTS
#     namespaces, its daemon on host1 through bench/netns_rsh.sh (--mca plm_rsh_agent), with
#     its defaults otherwise: shared memory within a host, its TCP transport on eth0 between
#     them, and mpi_yield_when_idle (4 ranks on 2 cores: its polling ranks otherwise keep
#     the one they wait for off the CPU, 4-15x slower in a trial). mpirun's own ranks share the machine's /dev/shm (nsenter needs the outer /proc to
#     reach host1), which only host0's two ranks use.
# Every process gets a launcher's plain environment (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR = host0's address, MASTER_PORT) and its host's address
# (TROUPE_LOCAL_ADDR; GLOO_SOCKET_IFNAME and TP_SOCKET_IFNAME for torch). Prints the medians
# and ratios against the targets of bench/RESULTS.md (bench/hosts_summary.py).
#
#   sudo bench/hosts_bench.sh [RUNS]      (default 3; exit 77 when hosts cannot be made)
# HOSTS_BENCH_JOBS="troupe_coll mpi_coll" runs only the jobs named (the list is `jobs`
# below); the others read "no data".
# Needs build/release (or TROUPE_BUILD_DIR) with rpc_bench and collectives_bench, and
# /usr/bin/python3 with torch. Every job is killed after HOSTS_BENCH_TIMEOUT seconds
# (default 300); the hosts and everything on them go away on every exit path.
set -u
runs=${1:-3}
if ! [[ "$runs" =~ ^[1-9][0-9]?$ ]]; then
  echo "usage: $0 [RUNS]   (RUNS: 1 to 99 rounds, not '$runs')" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${TROUPE_BUILD_DIR:-$root/build/release}
limit=${HOSTS_BENCH_TIMEOUT:-300}
py=/usr/bin/python3
for f in "$build/bench/rpc_bench" "$build/bench/collectives_bench"; do
  [[ -x "$f" ]] || { echo "hosts_bench: $f is missing (cmake --build $build --target rpc_bench collectives_bench)" >&2; exit 2; }
done
"$py" -c 'import torch' 2>/dev/null || { echo "hosts_bench: $py cannot import torch (scripts/install-deps.sh --bench)" >&2; exit 2; }

source "$root/tests/multihost/sim_hosts.sh"
reason=$(sim_hosts_check) || { echo "[troupe-skip] $reason" >&2; exit 77; }
sim_hosts_up 2 || exit 1   # traps EXIT, INT and TERM: sim_hosts_down
out=$sim_hosts_dir/bench   # goes away with the hosts
mkdir -p "$out"
cd "$root" || exit 1

rpc_args=(--iters 2000 --seconds 1 --sizes 1048576,16777216)
coll_sizes=(--min 4096 --max 16777216)
troupe_rpc=("$build/bench/rpc_bench" "${rpc_args[@]}")
lowlat_rpc=("${troupe_rpc[@]}" --inline --busy-poll-us 50)
anchor_rpc=("$py" bench/rpc_torch.py "${rpc_args[@]}")
troupe_coll=("$build/bench/collectives_bench" --ops allreduce,allreduce_hier "${coll_sizes[@]}" --json)
flat_coll=(env TROUPE_GLOO_HIERARCHICAL=0 "$build/bench/collectives_bench" --ops allreduce "${coll_sizes[@]}" --json)
anchor_coll=("$py" bench/collectives_torch_gloo.py --ops allreduce "${coll_sizes[@]}")
mpi_bench=$build/bench/mpi_collectives_bench
[[ -x $mpi_bench ]] && command -v mpirun >/dev/null ||
  echo "hosts_bench: no Open MPI anchor ($mpi_bench or mpirun missing: scripts/install-deps.sh --bench)" >&2
port=29400

# job NAME PER_HOST cmd...: runs cmd as ranks 0..2*PER_HOST-1, PER_HOST on each host
# (host0 first), each killed after $limit seconds; rank 0's stdout is appended to
# $out/NAME.jsonl. Returns 0 when every rank exited 0, else prints every rank's stderr.
job() {
  local name=$1 per_host=$2
  shift 2
  local world=$((2 * per_host)) master
  master=$(sim_host_addr 0)
  port=$((port + 1))
  local pids=() r h rc=0
  for ((r = 0; r < world; ++r)); do
    h=$((r / per_host))
    sim_host "$h" timeout -k 5 "$limit" env RANK=$r WORLD_SIZE=$world \
      LOCAL_RANK=$((r % per_host)) LOCAL_WORLD_SIZE=$per_host MASTER_ADDR="$master" \
      MASTER_PORT=$port TROUPE_LOCAL_ADDR="$(sim_host_addr "$h")" GLOO_SOCKET_IFNAME=eth0 \
      TP_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 "$@" >"$out/$name.$r.out" 2>"$out/$name.$r.err" &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || { rc=$?; echo "hosts_bench: $name rank $r exited with $rc" >&2; }
  done
  grep '^{' "$out/$name.0.out" >>"$out/$name.jsonl"
  if ((rc != 0)); then
    for ((r = 0; r < world; ++r)); do
      echo "---- $name rank $r (host$((r / per_host))) stderr" >&2
      tail -n 20 "$out/$name.$r.err" >&2
    done
  fi
  return "$rc"
}

# mpi_job NAME: Open MPI's allreduce at world 4, 2 ranks on each host (see the top); the
# JSON lines of rank 0 are appended to $out/NAME.jsonl.
mpi_job() {
  local name=$1 pids
  pids="$(sim_host_name 0)=$(sim_host_pid 0),$(sim_host_name 1)=$(sim_host_pid 1)"
  if ! nsenter -t "$(sim_host_pid 0)" -n -u -- timeout -k 5 "$limit" env SIM_HOSTS_PIDS="$pids" \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 --host host0:2,host1:2 \
    --mca plm_rsh_agent "$here/netns_rsh.sh" --mca btl_tcp_if_include eth0 \
    --mca oob_tcp_if_include eth0 --mca mpi_yield_when_idle 1 "$mpi_bench" --ops allreduce "${coll_sizes[@]}" \
    >"$out/$name.out" 2>"$out/$name.err"; then
    echo "hosts_bench: $name failed" >&2
    tail -n 20 "$out/$name.err" >&2
    return 1
  fi
  grep '^{' "$out/$name.out" >>"$out/$name.jsonl"
}

echo "# hosts: host0 $(sim_host_addr 0), host1 $(sim_host_addr 1) (veth pairs into one bridge)" >&2
# wanted NAME: whether HOSTS_BENCH_JOBS (names separated by spaces; every job when unset)
# names the job.
jobs="troupe_rpc anchor_rpc lowlat_rpc troupe_coll flat_coll anchor_coll mpi_coll"
wanted() { [[ -z ${HOSTS_BENCH_JOBS:-} || " $HOSTS_BENCH_JOBS " == *" $1 "* ]]; }
for name in ${HOSTS_BENCH_JOBS:-}; do
  [[ " $jobs " == *" $name "* ]] ||
    { echo "hosts_bench: HOSTS_BENCH_JOBS names '$name'; the jobs are $jobs" >&2; exit 2; }
done
for ((i = 1; i <= runs; ++i)); do
  if wanted troupe_rpc; then job troupe_rpc 1 "${troupe_rpc[@]}" || exit 1; fi
  if wanted anchor_rpc; then job anchor_rpc 1 "${anchor_rpc[@]}" || exit 1; fi
  if wanted lowlat_rpc; then job lowlat_rpc 1 "${lowlat_rpc[@]}" || exit 1; fi
  if wanted troupe_coll; then job troupe_coll 2 "${troupe_coll[@]}" || exit 1; fi
  if wanted flat_coll; then job flat_coll 2 "${flat_coll[@]}" || exit 1; fi
  if wanted anchor_coll; then job anchor_coll 2 "${anchor_coll[@]}" || exit 1; fi
  if wanted mpi_coll && [[ -x $mpi_bench ]] && command -v mpirun >/dev/null; then
    mpi_job mpi_coll || exit 1
  fi
  echo "round $i/$runs done" >&2
done

echo "# bench/hosts_bench.sh $runs: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), $(nproc) cores, median of $runs rounds"
echo "# rpc (rank 0 on host0, rank 1 on host1): ${troupe_rpc[*]#$root/} [--inline --busy-poll-us 50]  |  ${anchor_rpc[*]}"
echo "# allreduce (ranks 0,1 on host0, 2,3 on host1): ${troupe_coll[*]#$root/} [TROUPE_GLOO_HIERARCHICAL=0 --ops allreduce]  |  ${anchor_coll[*]}  |  mpirun -np 4 --host host0:2,host1:2 --mca mpi_yield_when_idle 1 ${mpi_bench#$root/} --ops allreduce ${coll_sizes[*]}"
"$py" "$here/hosts_summary.py" "$out"
