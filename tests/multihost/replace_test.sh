#!/usr/bin/env bash
# troupe-run --failure-policy replace across hosts: 2 hosts x 2 workers over the store
# backend, each worker in the job's membership (launcher_test_worker elastic). Rank 1 kills
# itself with SIGKILL after joining; its node's launcher takes it out of the membership and
# starts a replacement, which joins the running job; no other worker is restarted.
#   replace_test.sh TROUPE_RUN LAUNCHER_TEST_WORKER
set -u
troupe_run=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 2 || exit 1

for h in 0 1; do
  conf="local_addr=$(sim_host_addr "$h"),timeout=30s"
  if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
  # /tmp is private to each host: the worker's files stay there; its output is the record.
  mh_start "host$h" "$h" 60 "$troupe_run" --nnodes 2 --nproc-per-node 2 --node-rank "$h" \
    --max-restarts 1 --failure-policy replace --rdzv-backend store \
    --rdzv-endpoint "$(sim_host_addr 0):29500" --rdzv-id "replace-$$" --rdzv-conf "$conf" \
    "$worker" elastic /tmp
done
for h in 0 1; do
  mh_wait "host$h"
  mh_expect "the launcher on host$h finishes the job" test $? = 0
done
logs=("$mh_logs_dir/host0.log" "$mh_logs_dir/host1.log")
mh_expect "one launcher replaced worker rank 1 and let the others run on" \
  grep -q "replacing worker rank 1 (replacement 1 of 1); the other workers run on" "${logs[@]}"
mh_expect "no launcher restarted its worker group" \
  bash -c '! grep -q "restarting the worker group\|re-forming" "$@"' _ "${logs[@]}"
for r in 0 2 3; do
  mh_expect "worker rank $r started once" \
    test "$(cat "${logs[@]}" | grep -c "elastic: worker$r pid [0-9]* restart 0 joined")" = 1
done
mh_expect "rank 1 started twice, its replacement as restart 1" \
  grep -q "elastic: worker1 pid [0-9]* restart 1 joined" "${logs[@]}"
mh_expect "the launcher took the dead worker out of the membership at once" \
  grep -q "history: cause dead: worker1 (rank [0-9]*, host .*): its process ended with signal 9 (SIGKILL), seen by troupe-run" \
  "${logs[@]}"
mh_expect "the last epoch has all 4 workers, the replacement among them" \
  bash -c 'cat "$@" | grep "history: " | sed -n "/history: number 6$/,\$p" | grep -c "history: member worker" | grep -qx 4' \
  _ "${logs[@]}"
mh_finish
