#!/usr/bin/env bash
# troupe-run's multi-node rendezvous across 2 hosts x 2 workers, over the store backend
# (host0 hosts the store) or etcd (on its own host): the README's rendezvous demo, whose
# workers exchange and validate their device maps through the job's store.
#   rendezvous_test.sh store|etcd TROUPE_RUN RENDEZVOUS_DEMO
set -u
backend=$1 troupe_run=$2 demo=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts

if [[ "$backend" == etcd ]]; then
  sim_hosts_up 2 --etcd || exit 1
  endpoint=$(sim_hosts_etcd_endpoint)
else
  sim_hosts_up 2 || exit 1
  endpoint=$(sim_host_addr 0):29500
fi
for h in 0 1; do
  conf="local_addr=$(sim_host_addr $h)"
  if [[ "$backend" == store ]]; then
    if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  fi
  mh_start "host$h" "$h" 60 "$troupe_run" --nnodes 2 --nproc-per-node 2 \
    --rdzv-backend "$backend" --rdzv-endpoint "$endpoint" --rdzv-id "rdzv-$$" \
    --rdzv-conf "$conf" "$demo"
done
for h in 0 1; do
  mh_wait "host$h"
  mh_expect "the launcher on host$h succeeds" test $? = 0
  mh_expect "host$h runs 2 of the 4 ranks" grep -Eq "ranks [02]-[13] of 4" "$mh_logs_dir/host$h.log"
done
for w in 0 1 2 3; do
  mh_expect "worker$w sees all 4 workers and its reverse device maps" \
    grep -q "worker$w: 4 workers, device count 0, reverse maps {worker" "$mh_logs_dir"/host*.log
done
mh_finish
