#!/usr/bin/env bash
# Mutual TLS for RPC between hosts: a CA made here signs one certificate per host (with
# the host's address), troupe-run on each host gets TROUPE_TLS_CERT/KEY/CA and its
# workers inherit them.
#  1. The README's RPC snippet across 2 hosts, over TLS: every worker calls every worker.
#  2. The same job with host1's launcher given no TLS files: its worker is refused (the
#     refusal is logged with the peer's address on the host that refused), and the job fails.
#   rpc_tls_test.sh TROUPE_RUN RPC_HOSTS_WORKER
set -u
troupe_run=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
mh_skip_unless_hosts
command -v openssl >/dev/null || { echo "[troupe-skip] the openssl command is not installed"; exit 77; }
sim_hosts_up 2 || exit 1

# The certificates live in the working directory (outside /tmp, which each host has its
# own of), and go on every exit path.
pki=$(mktemp -d "$PWD/rpc-tls-pki.XXXXXX") || exit 1
trap 'rm -rf "$pki"; sim_hosts_down' EXIT
trap 'rm -rf "$pki"; sim_hosts_down; exit 130' INT
trap 'rm -rf "$pki"; sim_hosts_down; exit 143' TERM
key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
(
  cd "$pki" &&
  openssl req -x509 $key -keyout ca.key -out ca.pem -days 2 -subj /CN=job-ca 2>/dev/null &&
  for h in 0 1; do
    printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$(sim_host_addr $h)" >host$h.cnf &&
    openssl req $key -keyout host$h.key -out host$h.csr -subj "/CN=host$h" 2>/dev/null &&
    openssl x509 -req -in host$h.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile host$h.cnf -out host$h.pem 2>/dev/null || exit 1
  done
) || { echo "cannot make the test's certificates"; exit 1; }

tls_env() {
  echo "TROUPE_TLS_CERT=$pki/host$1.pem" "TROUPE_TLS_KEY=$pki/host$1.key" "TROUPE_TLS_CA=$pki/ca.pem"
}

# run_job PORT TLS_HOSTS...: the snippet on host0 and host1; the hosts named get TLS.
run_job() {
  local port=$1 h conf envs
  shift
  for h in 0 1; do
    conf="local_addr=$(sim_host_addr $h)"
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

run_job 29501 0
for h in 0 1; do
  mh_wait "job29501-host$h"
  mh_expect "host1 without TLS: the launcher on host$h fails" test $? != 0
done
all=$(cat "$mh_logs_dir"/job29501-*.log)
# Whichever side connects first is refused by the other; that one logs the refusal.
mh_expect "host1 without TLS: a refusal names the other host's address and what to set" \
  grep -Eq "refused a (connection without TLS|TLS connection) from 10\.[0-9.]+:[0-9]+.*TROUPE_TLS_CERT" <<<"$all"
mh_expect "host1 without TLS: no RPC went through" bash -c '! grep -Eq "(^|]: )worker.: ok" <<<"$0"' "$all"
mh_finish
