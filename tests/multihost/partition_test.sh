#!/usr/bin/env bash
# A host cut off mid-job: train_demo on 2 hosts x 2 workers; once training runs, host1's
# link goes down. The launcher on host0 must fail on its own, within the job's timeouts,
# with an error naming the host it lost (its name or address); nothing may hang until
# the test's own time limit kills it.
#   partition_test.sh TROUPE_RUN TRAIN_DEMO
set -u
troupe_run=$1 train_demo=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 2 || exit 1

for h in 0 1; do
  conf="local_addr=$(sim_host_addr $h),heartbeat_timeout=10s,timeout=15s"
  if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  mh_start "host$h" "$h" 100 "$troupe_run" --nnodes 2 --nproc-per-node 2 \
    --rdzv-backend store --rdzv-endpoint "$(sim_host_addr 0):29500" --rdzv-id "cut-$$" \
    --rdzv-conf "$conf" "$train_demo" --epochs 1000 --samples 2048 --timeout 20s
done
training=0
for ((i = 0; i < 600; ++i)); do
  if grep -Eq "epoch [0-9]+/" "$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log" 2>/dev/null; then
    training=1
    break
  fi
  kill -0 "${mh_pids[host0]}" "${mh_pids[host1]}" 2>/dev/null || break
  sleep 0.1
done
mh_expect "the job trains across both hosts before the cut" test "$training" = 1
sim_host_cut 1
mh_wait host0; rc0=$?
mh_expect "the launcher on host0 fails on its own, not by the test's time limit" \
  test "$rc0" != 0 -a "$rc0" != 124 -a "$rc0" != 137
mh_expect "host0's error names the host it lost" \
  grep -Eq "host1|$(sim_host_addr 1)" "$mh_logs_dir/host0.log"
mh_wait host1; rc1=$?
mh_expect "the launcher on the cut-off host1 fails on its own too" \
  test "$rc1" != 0 -a "$rc1" != 124 -a "$rc1" != 137
mh_finish
