#!/usr/bin/env bash
# Mutual TLS for RPC between hosts: a CA made here signs one certificate per host (with
# the host's address), troupe-run on each host gets TROUPE_TLS_CERT/KEY/CA and its
# workers inherit them.
#  1. The README's RPC snippet across 2 hosts, over TLS: every worker calls every worker.
#  2. The same job with host1's launcher given no TLS files: it is refused (by the store on
#     host0, which speaks TLS too, or by a TLS worker; the refusal is logged with the
#     peer's address on the host that refused), and the job fails.
#   rpc_tls_test.sh TROUPE_RUN RPC_HOSTS_WORKER
set -u
troupe_run=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
source "$here/tls_pki.sh"
mh_skip_unless_hosts
mh_tls_hosts_up 2 rpc-tls

tls_env() { mh_tls_env "$pki" "$1"; }
a1=$(sim_host_addr 1)

# run_job PORT TLS_HOSTS...: the snippet on host0 and host1; the hosts named get TLS.
# Each launcher waits at most $join_timeout seconds for the other.
join_timeout=45
run_job() {
  local port=$1 h conf envs
  shift
  for h in 0 1; do
    conf="local_addr=$(sim_host_addr $h),timeout=$join_timeout"
    if ((h == 0)); then conf+=",is_host=true"; else conf+=",is_host=false"; fi
    envs=""
    [[ " $* " == *" $h "* ]] && envs=$(tls_env $h)
    # shellcheck disable=SC2086
    mh_start "job$port-host$h" "$h" 60 env TROUPE_LOG_LEVEL=debug $envs "$troupe_run" --nnodes 2 \
      --nproc-per-node 1 --max-restarts 0 --rdzv-backend store \
      --rdzv-endpoint "$(sim_host_addr 0):$port" --rdzv-id "rpc-tls-$port-$$" --rdzv-conf "$conf" \
      "$worker" static
  done
}

run_job 29500 0 1
for h in 0 1; do
  mh_wait "job29500-host$h"
  mh_expect "over TLS: the launcher on host$h succeeds" test $? = 0
done
all=$(cat "$mh_logs_dir"/job29500-*.log)
for w in 0 1; do
  mh_expect "over TLS: worker$w passed every check" grep -Eq "(^|]: )worker$w: ok" <<<"$all"
  for h in 0 1; do
    mh_expect "over TLS: worker$w reached a worker on host$h" \
      grep -Eq "(^|]: )worker$w: called worker. on host host$h" <<<"$all"
  done
done
mh_expect "the connections between the hosts were TLS 1.3 with AES-GCM" \
  grep -Eq "TLS established with 10\.[0-9.]+:[0-9]+ \(TLSv1\.3 TLS_AES_128_GCM_SHA256\)" <<<"$all"
mh_expect "the store troupe-run hosts on host0 spoke TLS with host1" \
  grep -Eq "tcp store server [0-9.]+:29500: TLS established with ${a1//./\\.}:[0-9]+ \(TLSv1\.3" <<<"$all"

# host1 is refused at once; host0's launcher then gives up waiting for it on its own.
join_timeout=15
run_job 29501 0
for h in 0 1; do
  mh_wait "job29501-host$h"
  mh_expect "host1 without TLS: the launcher on host$h fails" test $? != 0
done
all=$(cat "$mh_logs_dir"/job29501-*.log)
# host1's launcher meets the store on host0 first, which refuses it and logs why (were the
# store plain, whichever RPC side connects first would be refused by the other).
mh_expect "host1 without TLS: a refusal names the other host's address and what to set" \
  grep -Eq "(refused a (connection without TLS|TLS connection) from|refusing) 10\.[0-9.]+:[0-9]+.*TROUPE_TLS_CERT" <<<"$all"
mh_expect "host1 without TLS: the store on host0 refused host1's launcher and logged why" \
  grep -Eq "refusing ${a1//./\\.}:[0-9]+: a connection without TLS.*TROUPE_TLS_CERT" <<<"$all"
mh_expect "host1 without TLS: no RPC went through" bash -c '! grep -Eq "(^|]: )worker.: ok" <<<"$0"' "$all"
mh_finish
