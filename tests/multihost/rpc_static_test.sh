#!/usr/bin/env bash
# The README's RPC snippet across 3 hosts: troupe-run on each host starts one worker,
# init_rpc_from_env makes a static group of three, and every worker calls every worker
# (itself included): add, a tensor echo, a nested call to a third worker, remote
# references both ways. With "restart", worker1 exits on attempt 0 and the job, under
# --max-restarts 1, must complete on attempt 1 without reading the dead attempt's records.
#   rpc_static_test.sh [restart] TROUPE_RUN RPC_HOSTS_WORKER
set -u
mode=static restarts=0
if [[ "$1" == restart ]]; then
  mode=static_restart restarts=1
  shift
fi
troupe_run=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 3 || exit 1

for h in 0 1 2; do
  conf="local_addr=$(sim_host_addr $h)"
  if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  mh_start "host$h" "$h" 80 "$troupe_run" --nnodes 3 --nproc-per-node 1 --max-restarts "$restarts" \
    --rdzv-backend store --rdzv-endpoint "$(sim_host_addr 0):29500" --rdzv-id "rpc-$$" \
    --rdzv-conf "$conf" "$worker" "$mode"
done
for h in 0 1 2; do
  mh_wait "host$h"
  mh_expect "the launcher on host$h succeeds" test $? = 0
done
all=$(cat "$mh_logs_dir"/host*.log)
for w in 0 1 2; do
  mh_expect "worker$w passed every check" grep -Eq "(^|]: )worker$w: ok" <<<"$all"
  for h in 0 1 2; do
    mh_expect "worker$w reached a worker on host$h" grep -Eq "(^|]: )worker$w: called worker. on host host$h" <<<"$all"
  done
done
if [[ "$mode" == static_restart ]]; then
  mh_expect "worker1 exited on attempt 0 and the group restarted" \
    grep -q "exiting on attempt 0 on purpose" <<<"$all"
fi
mh_finish
