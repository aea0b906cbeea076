#!/usr/bin/env bash
# A dynamic RPC group across hosts: a troupe-store on host0, members on host0 and host1;
# a worker on host2 joins, calls both (tensors, remote references, nested calls) and
# leaves; the members see it come and go and go on calling each other.
#   rpc_dynamic_test.sh TROUPE_STORE RPC_HOSTS_WORKER
set -u
troupe_store=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
sim_hosts_up 3 || exit 1

a0=$(sim_host_addr 0)
mh_start store 0 80 "$troupe_store" --host "$a0" --port 29500
url="tcp://$a0:29500"
for ((i = 0; i < 100; ++i)); do
  grep -q "listening on" "$mh_logs_dir/store.log" 2>/dev/null && break
  sleep 0.1
done
mh_start alice 0 70 "$worker" dynamic "$url" alice carol
mh_start bob 1 70 "$worker" dynamic "$url" bob carol
ready=0
for ((i = 0; i < 400; ++i)); do
  if grep -q "alice: ready" "$mh_logs_dir/alice.log" && grep -q "bob: ready" "$mh_logs_dir/bob.log"; then
    ready=1
    break
  fi
  kill -0 "${mh_pids[alice]}" "${mh_pids[bob]}" 2>/dev/null || break
  sleep 0.1
done
mh_expect "the members on host0 and host1 call each other and wait" test "$ready" = 1
mh_start carol 2 60 "$worker" joiner "$url" carol
mh_wait carol
mh_expect "the worker on host2 joins, calls every member and leaves" test $? = 0
mh_wait alice
mh_expect "the member on host0 saw host2's worker come and go, and goes on" test $? = 0
mh_wait bob
mh_expect "the member on host1 saw host2's worker come and go, and goes on" test $? = 0
mh_expect "carol reached alice on host0 and bob on host1" \
  grep -q "carol: called alice on host host0" "$mh_logs_dir/carol.log"
mh_expect "carol reached bob on host1" grep -q "carol: called bob on host host1" "$mh_logs_dir/carol.log"
kill "${mh_pids[store]}" 2>/dev/null
mh_finish
