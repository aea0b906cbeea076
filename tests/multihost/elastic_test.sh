#!/usr/bin/env bash
# Elastic jobs across hosts: train_demo under troupe-run --nnodes 2:3 --nproc-per-node 2.
#   elastic_test.sh join TROUPE_RUN TRAIN_DEMO   host0 and host1 start training; host2's
#       launcher joins mid-job; the world re-forms with 3 nodes (6 workers) and finishes,
#       its weights matching a single-process run
#   elastic_test.sh kill TROUPE_RUN TRAIN_DEMO   3 hosts train; host2's launcher is
#       killed with SIGKILL (its workers die with it); the survivors' workers fail,
#       their launchers (--max-restarts 1) re-form with 2 nodes (4 workers) and finish
set -u
mode=$1 troupe_run=$2 train_demo=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 3 || exit 1

start_node() {  # start_node HOST EPOCHS
  local h=$1 conf
  conf="local_addr=$(sim_host_addr "$h"),heartbeat_timeout=5s,last_call_timeout=2s,timeout=30s"
  if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  mh_start "host$h" "$h" 100 "$troupe_run" --nnodes 2:3 --nproc-per-node 2 --max-restarts 1 \
    --rdzv-backend store --rdzv-endpoint "$(sim_host_addr 0):29500" --rdzv-id "elastic-$$" \
    --rdzv-conf "$conf" "$train_demo" --epochs "$2" --samples 8192 --timeout 20s
}
# Waits (at most 60 s) until a host's log matches the extended regex; 0 when one does.
# (Ranks go to nodes in the order they join, so rank 0 may be on any host.)
wait_for() {
  local i
  for ((i = 0; i < 600; ++i)); do
    cat "$mh_logs_dir"/host*.log 2>/dev/null | grep -Eq "$1" && return 0
    sleep 0.1
  done
  return 1
}

if [[ "$mode" == join ]]; then
  start_node 0 40
  start_node 1 40
  wait_for "epoch [0-9]+/"
  mh_expect "2 nodes train before the third joins" grep -q "of 4), " "$mh_logs_dir/host0.log"
  start_node 2 40
  for h in 0 1 2; do
    mh_wait "host$h"
    mh_expect "the launcher on host$h succeeds" test $? = 0
  done
  mh_expect "the world grows to 3 nodes (6 workers)" grep -q "of 6), " "$mh_logs_dir/host2.log"
  mh_expect "all 6 workers hold identical weights that match a single-process run" \
    grep -q "all 6 worker(s) hold identical weights.*matches a single-process run" \
    "$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log" "$mh_logs_dir/host2.log"
else
  start_node 0 40
  start_node 1 40
  start_node 2 40
  wait_for "with 6 worker\(s\)"
  mh_expect "3 nodes train together" grep -q "of 6), " "$mh_logs_dir/host0.log"
  mh_signal host2 2 KILL
  for h in 0 1; do
    mh_wait "host$h"
    mh_expect "the launcher on host$h finishes the job" test $? = 0
  done
  mh_expect "the survivors re-form as 2 nodes (4 workers)" \
    grep -Eq "round [1-9]: .*of 4\), " "$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log"
  mh_expect "all 4 surviving workers hold identical weights that match a single-process run" \
    grep -q "all 4 worker(s) hold identical weights.*matches a single-process run" \
    "$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log"
fi
mh_finish
