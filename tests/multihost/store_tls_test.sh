#!/usr/bin/env bash
# Mutual TLS for the TCP store between hosts: a CA made here signs one certificate per
# host (with the host's address); troupe-store and the store clients get TROUPE_TLS_*.
#  1. A client on host1 without TLS files is refused at once and told what to set; the
#     store on host0 logs the refusal with host1's address.
#  2. Clients on host0 and host1 with the job's certificates gather, pass two barriers and
#     count through that store over TLS 1.3 (the same store, after the refusal).
#  3. A client with TLS against a troupe-store without TLS is refused at once, with the
#     store's address; that store logs the refusal.
#   store_tls_test.sh TROUPE_STORE STORE_TEST_WORKER
set -u
troupe_store=$1 worker=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
source "$here/jobs.sh"
source "$here/tls_pki.sh"
mh_skip_unless_hosts
mh_tls_hosts_up 2 store-tls

a0=$(sim_host_addr 0)
a1=$(sim_host_addr 1)

# wait_listening NAME: until the store's log says it listens (at most 10 s).
wait_listening() {
  local i
  for ((i = 0; i < 100; ++i)); do
    grep -q "listening on" "$mh_logs_dir/$1.log" 2>/dev/null && return 0
    kill -0 "${mh_pids[$1]}" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# shellcheck disable=SC2046
mh_start store 0 90 env TROUPE_LOG_LEVEL=debug $(mh_tls_env "$pki" 0) \
  "$troupe_store" --host "$a0" --port 29600
mh_expect "troupe-store with TLS listens on host0" wait_listening store
url="tcp://$a0:29600"

started=$SECONDS
mh_start plain 1 40 "$worker" gather "$url" 0 2
mh_wait plain
mh_expect "a client without TLS on host1 fails" test $? != 0
mh_expect "... at once (no retries until its connect timeout)" test $((SECONDS - started)) -lt 15
mh_expect "... told that the store requires TLS and what to set" \
  grep -Eq "refused by the tcp store server at $a0:29600: .*requires TLS.*TROUPE_TLS_CERT" "$mh_logs_dir/plain.log"
mh_expect "the store logs the refusal with host1's address" \
  grep -Eq "refusing ${a1//./\\.}:[0-9]+: a connection without TLS.*TROUPE_TLS_CERT" "$mh_logs_dir/store.log"

# shellcheck disable=SC2046
mh_start w0 0 60 env $(mh_tls_env "$pki" 0) "$worker" gather "$url" 0 2
# shellcheck disable=SC2046
mh_start w1 1 60 env $(mh_tls_env "$pki" 1) "$worker" gather "$url" 1 2
mh_wait w0
mh_expect "over TLS: the client on host0 gathers, passes the barriers and counts" test $? = 0
mh_wait w1
mh_expect "over TLS: the client on host1 gathers, passes the barriers and counts" test $? = 0
mh_expect "the store's sessions with both hosts were TLS 1.3 with AES-GCM" \
  bash -c 'grep -Eq "TLS established with ${1//./\\.}:[0-9]+ \(TLSv1\.3 TLS_AES_128_GCM_SHA256\)" "$0" &&
           grep -Eq "TLS established with ${2//./\\.}:[0-9]+ \(TLSv1\.3 TLS_AES_128_GCM_SHA256\)" "$0"' \
  "$mh_logs_dir/store.log" "$a0" "$a1"

mh_start plainstore 0 60 "$troupe_store" --host "$a0" --port 29601
mh_expect "troupe-store without TLS listens on host0" wait_listening plainstore
started=$SECONDS
# shellcheck disable=SC2046
mh_start tlsclient 1 40 env $(mh_tls_env "$pki" 1) "$worker" gather "tcp://$a0:29601" 0 2
mh_wait tlsclient
mh_expect "a TLS client on host1 against a store without TLS fails" test $? != 0
mh_expect "... at once" test $((SECONDS - started)) -lt 15
mh_expect "... naming the store's address and what to set" \
  grep -Eq "tcp store server at $a0:29601 answered without TLS.*TROUPE_TLS_CERT" "$mh_logs_dir/tlsclient.log"
mh_expect "the store without TLS logs the refusal with host1's address" \
  grep -Eq "refusing ${a1//./\\.}:[0-9]+: .*does not use TLS.*TROUPE_TLS_CERT" "$mh_logs_dir/plainstore.log"

kill "${mh_pids[store]}" "${mh_pids[plainstore]}" 2>/dev/null
mh_finish
