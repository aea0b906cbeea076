#!/usr/bin/env bash
# troupe-run --failure-policy replace with nodes that come and go: host0 and host1 run a job
# (--nnodes 2:3, 2 workers each, launcher_test_worker follow: each worker follows the job's
# membership and prints it); host2's launcher arrives, its workers join the running job;
# it is then stopped with SIGTERM and its workers leave. host0's and host1's workers run
# on throughout: none is restarted and no round re-forms.
#   replace_nodes_test.sh TROUPE_RUN LAUNCHER_TEST_WORKER
set -u
troupe_run=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 3 || exit 1

start_node() {  # start_node HOST
  local h=$1 conf
  conf="local_addr=$(sim_host_addr "$h"),heartbeat_timeout=5s,last_call_timeout=1s,timeout=30s"
  if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  # /tmp is private to each host: the worker's files stay there; its output is the record.
  mh_start "host$h" "$h" 90 "$troupe_run" --nnodes 2:3 --nproc-per-node 2 \
    --failure-policy replace --stop-grace 3s --rdzv-backend store \
    --rdzv-endpoint "$(sim_host_addr 0):29500" --rdzv-id "replace-nodes-$$" \
    --rdzv-conf "$conf" "$worker" follow /tmp
}
# Every wait below is bounded, so that the script ends (and prints the logs) within the
# test's 180 s even when the launchers hang until their own 90 s.
# Waits (at most 30 s) until the last membership that worker rank 0 printed is exactly the
# given names; 0 when it is. Rank 0 runs on host0 or host1, whichever node the rendezvous
# ranked first (the order the launchers arrived in).
wait_for_members() {
  local i
  for ((i = 0; i < 300; ++i)); do
    [[ "$(cat "$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log" 2>/dev/null |
          grep -o "^\[0\]: members: [0-9]* .*" | tail -n 1 | cut -d' ' -f4)" == "$1" ]] && return 0
    sleep 0.1
  done
  return 1
}

# Waits (at most 20 s) until the log NAME has a line with the fixed string; 0 when it does.
wait_for_line() {
  local i
  for ((i = 0; i < 200; ++i)); do
    grep -qF "$2" "$mh_logs_dir/$1.log" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

start_node 0
start_node 1
mh_expect "host0 and host1 form a job of 4 workers" \
  wait_for_members worker0,worker1,worker2,worker3
start_node 2
mh_expect "host2's workers join the running job: the membership holds all 6" \
  wait_for_members worker0,worker1,worker2,worker3,worker4,worker5
mh_expect "host2's launcher says it joined the running job" \
  grep -q "joined the running job in round 0 as group rank 2 with ranks 4-5" \
  "$mh_logs_dir/host2.log"
mh_expect "host0's launcher sees host2 arrive, and lets its workers run on" \
  wait_for_line host0 "arrived in the running round 0 as group rank 2 with ranks 4-5"
mh_signal host2 2 TERM
mh_wait host2
mh_expect "host2's launcher exits 143 after SIGTERM" test $? = 143
mh_expect "host2's workers leave: the membership holds the first 4 again" \
  wait_for_members worker0,worker1,worker2,worker3
mh_expect "host0's launcher sees host2 leave, and lets its workers run on" \
  wait_for_line host0 ") left round 0: the troupe-run of node host2"
for h in 0 1; do sim_host "$h" touch /tmp/stop; done
for h in 0 1; do
  mh_wait "host$h"
  mh_expect "the launcher on host$h finishes the job" test $? = 0
done
logs=("$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log")
mh_expect "no launcher restarted its worker group or re-formed" \
  bash -c '! grep -q "restarting the worker group\|re-forming" "$@"' _ "${logs[@]}"
for r in 0 1 2 3; do
  mh_expect "worker rank $r started once" \
    test "$(cat "${logs[@]}" | grep -c "^\[$r\]: worker rank $r started")" = 1
done
mh_finish
