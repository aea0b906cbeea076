#!/usr/bin/env bash
# The README's RPC snippet across 3 hosts: troupe-run on each host starts one worker,
# init_rpc_from_env makes a static group of three, and every worker calls every worker
# (itself included): add, a tensor echo, a nested call to a third worker, remote
# references both ways.
#   rpc_static_test.sh TROUPE_RUN RPC_HOSTS_WORKER
set -u
troupe_run=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 3 || exit 1

for h in 0 1 2; do
  conf="local_addr=$(sim_host_addr $h)"
  if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  mh_start "host$h" "$h" 80 "$troupe_run" --nnodes 3 --nproc-per-node 1 \
    --rdzv-backend store --rdzv-endpoint "$(sim_host_addr 0):29500" --rdzv-id "rpc-$$" \
    --rdzv-conf "$conf" "$worker" static
done
for h in 0 1 2; do
  mh_wait "host$h"
  mh_expect "the launcher on host$h succeeds" test $? = 0
done
all=$(cat "$mh_logs_dir"/host*.log)
for w in 0 1 2; do
  mh_expect "worker$w passed every check" grep -q "^worker$w: ok" <<<"$all"
  for h in 0 1 2; do
    mh_expect "worker$w reached a worker on host$h" grep -q "^worker$w: called worker. on host host$h" <<<"$all"
  done
done
mh_finish
