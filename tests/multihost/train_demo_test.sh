#!/usr/bin/env bash
# train_demo on 2 hosts x 2 workers under troupe-run, as the README runs it on two
# machines: over the store backend (host0 hosts the store) or over etcd (on its own
# host). Every worker's weights must match the others' and a single-process run.
#   train_demo_test.sh store|etcd TROUPE_RUN TRAIN_DEMO
set -u
backend=$1 troupe_run=$2 train_demo=$3
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
  mh_start "host$h" "$h" 80 "$troupe_run" --nnodes 2 --nproc-per-node 2 \
    --rdzv-backend "$backend" --rdzv-endpoint "$endpoint" --rdzv-id "train-$$" \
    --rdzv-conf "$conf" "$train_demo" --epochs 2 --samples 2048 --timeout 30s
done
mh_wait host0; rc0=$?
mh_wait host1; rc1=$?

mh_expect "the launcher on host0 succeeds" test "$rc0" = 0
mh_expect "the launcher on host1 succeeds" test "$rc1" = 0
mh_expect "all 4 workers hold identical weights that match a single-process run" \
  grep -q "all 4 worker(s) hold identical weights.*matches a single-process run" \
  "$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log"
mh_finish
