#!/usr/bin/env bash
# The actors examples across hosts under troupe-run: ping-pong between a worker on host0
# and one on host1, and the parameter server with its trainers on 2 hosts x 2 workers.
#   actors_test.sh ping_pong|parameter_server TROUPE_RUN EXAMPLE
set -u
example=$1 troupe_run=$2 program=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 2 || exit 1

if [[ "$example" == ping_pong ]]; then
  per_node=1 args=(--rounds 200) expect="200 round trips to worker1/pong"
else
  per_node=2 args=() expect="parameter_server: converged"
fi
for h in 0 1; do
  conf="local_addr=$(sim_host_addr $h)"
  if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  mh_start "host$h" "$h" 80 "$troupe_run" --nnodes 2 --nproc-per-node "$per_node" \
    --rdzv-backend store --rdzv-endpoint "$(sim_host_addr 0):29500" --rdzv-id "$example-$$" \
    --rdzv-conf "$conf" "$program" "${args[@]}"
done
mh_wait host0; rc0=$?
mh_wait host1; rc1=$?
mh_expect "the launcher on host0 succeeds" test "$rc0" = 0
mh_expect "the launcher on host1 succeeds" test "$rc1" = 0
mh_expect "$example says: $expect" grep -q "$expect" "$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log"
mh_finish
