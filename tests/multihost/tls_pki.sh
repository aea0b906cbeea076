#!/usr/bin/env bash
# tls_pki.sh: a throwaway certificate authority for the multihost TLS tests (a library;
# needs the openssl command and sim_hosts.sh sourced first).
#   source tls_pki.sh
#   mh_make_pki DIR N     # DIR/ca.pem, and DIR/host<i>.pem and .key for hosts 0..N-1,
#                         # each with the host's address as its subjectAltName
#   mh_tls_env DIR I      # TROUPE_TLS_CERT=... TROUPE_TLS_KEY=... TROUPE_TLS_CA=... of host I
#   mh_tls_hosts_up N NAME  # skips without openssl; N hosts up; a PKI for them in
#                           # $pki (under the working directory, NAME in its folder's
#                           # name); hosts and PKI torn down on every exit path
# DIR must be visible on every host (outside /tmp, which each host has its own of); the
# caller removes it on every exit path.

mh_make_pki() {
  local dir=$1 n=$2 h
  local key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
  (
    cd "$dir" || exit 1
    # shellcheck disable=SC2086
    openssl req -x509 $key -keyout ca.key -out ca.pem -days 2 -subj /CN=job-ca 2>/dev/null || exit 1
    for ((h = 0; h < n; ++h)); do
      printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$(sim_host_addr $h)" >host$h.cnf &&
      # shellcheck disable=SC2086
      openssl req $key -keyout host$h.key -out host$h.csr -subj "/CN=host$h" 2>/dev/null &&
      openssl x509 -req -in host$h.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -extfile host$h.cnf -out host$h.pem 2>/dev/null || exit 1
    done
  )
}

mh_tls_env() {
  echo "TROUPE_TLS_CERT=$1/host$2.pem" "TROUPE_TLS_KEY=$1/host$2.key" "TROUPE_TLS_CA=$1/ca.pem"
}

mh_tls_hosts_up() {
  local n=$1 name=$2
  command -v openssl >/dev/null || { echo "[troupe-skip] the openssl command is not installed"; exit 77; }
  sim_hosts_up "$n" || exit 1
  # The certificates live in the working directory (outside /tmp, which each host has its
  # own of), and go on every exit path.
  pki=$(mktemp -d "$PWD/$name-pki.XXXXXX") || exit 1
  trap 'rm -rf "$pki"; sim_hosts_down' EXIT
  trap 'rm -rf "$pki"; sim_hosts_down; exit 130' INT
  trap 'rm -rf "$pki"; sim_hosts_down; exit 143' TERM
  mh_make_pki "$pki" "$n" || { echo "cannot make the test's certificates"; exit 1; }
}
