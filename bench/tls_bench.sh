#!/usr/bin/env bash
# What mutual TLS costs RPC between two simulated hosts (tests/multihost/sim_hosts.sh):
# rpc_bench (rank 0 on host0 drives, rank 1 on host1 serves) plain and with
# TROUPE_TLS_CERT/KEY/CA, alternating for RUNS rounds in one run (plain first), medians.
# rpc_bench also measures a raw TCP ping-pong and echo between the same two processes
# (never TLS), which shows how the machine drifts between the two variants. Each round
# also runs store_bench --tcp-only with one client on host0 (the TCP store over loopback
# TCP, server and client in separate processes), plain and with the same variables.
#
#   sudo bench/tls_bench.sh [RUNS]      (default 5; exit 77 when hosts cannot be made)
# Needs build/release (or TROUPE_BUILD_DIR) with rpc_bench and store_bench, and the openssl
# command. Every
# job is killed after TLS_BENCH_TIMEOUT seconds (default 120); the hosts and the
# certificates made here go away on every exit path.
set -u
runs=${1:-5}
if ! [[ "$runs" =~ ^[1-9][0-9]?$ ]]; then
  echo "usage: $0 [RUNS]   (RUNS: 1 to 99 rounds, not '$runs')" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${TROUPE_BUILD_DIR:-$root/build/release}
limit=${TLS_BENCH_TIMEOUT:-120}
for b in rpc_bench store_bench; do
  [[ -x "$build/bench/$b" ]] || { echo "tls_bench: $build/bench/$b is missing (cmake --build $build --target $b)" >&2; exit 2; }
done
command -v openssl >/dev/null || { echo "tls_bench: the openssl command is not installed" >&2; exit 2; }

source "$root/tests/multihost/sim_hosts.sh"
reason=$(sim_hosts_check) || { echo "[troupe-skip] $reason" >&2; exit 77; }
sim_hosts_up 2 || exit 1
out=$sim_hosts_dir/bench   # goes away with the hosts
mkdir -p "$out"
# The certificates sit in the build directory (each host has its own /tmp).
pki=$(mktemp -d "$build/tls-bench-pki.XXXXXX") || exit 1
trap 'rm -rf "$pki"; sim_hosts_down' EXIT
trap 'rm -rf "$pki"; sim_hosts_down; exit 130' INT
trap 'rm -rf "$pki"; sim_hosts_down; exit 143' TERM
key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
(
  cd "$pki" &&
  openssl req -x509 $key -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca 2>/dev/null &&
  printf 'extendedKeyUsage=serverAuth,clientAuth\n' >node.cnf &&
  openssl req $key -keyout node.key -out node.csr -subj /CN=node 2>/dev/null &&
  openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile node.cnf -out node.pem 2>/dev/null
) || { echo "tls_bench: cannot make the certificates" >&2; exit 1; }
cd "$root" || exit 1

bench=("$build/bench/rpc_bench" --iters 2000 --seconds 1 --sizes 1048576,16777216)
tls=(TROUPE_TLS_CERT="$pki/node.pem" TROUPE_TLS_KEY="$pki/node.key" TROUPE_TLS_CA="$pki/ca.pem")
port=29600

# job NAME [VAR=value...] -- cmd...: rank 0 on host0, rank 1 on host1; rank 0's JSON
# lines are appended to $out/NAME.jsonl.
job() {
  local name=$1 extra=() r rc=0 pids=()
  shift
  while [[ "$1" != -- ]]; do extra+=("$1"); shift; done
  shift
  port=$((port + 1))
  for r in 0 1; do
    sim_host "$r" timeout -k 5 "$limit" env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="$(sim_host_addr 0)" MASTER_PORT=$port TROUPE_LOCAL_ADDR="$(sim_host_addr $r)" \
      "${extra[@]}" "$@" >"$out/$name.$r.out" 2>"$out/$name.$r.err" &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}" || { rc=$?; echo "tls_bench: $name rank $r exited with $rc" >&2; tail -n 20 "$out/$name.$r.err" >&2; }
  done
  grep '^{' "$out/$name.0.out" >>"$out/$name.jsonl"
  return "$rc"
}

store=("$build/bench/store_bench" --tcp-only --clients 1 --seconds 1 --rounds 200)

# store_job NAME [VAR=value...]: store_bench on host0; its JSON lines go to $out/NAME.jsonl.
store_job() {
  local name=$1
  shift
  sim_host 0 timeout -k 5 "$limit" env "$@" "${store[@]}" >>"$out/$name.jsonl" 2>"$out/$name.err" ||
    { echo "tls_bench: $name failed" >&2; tail -n 20 "$out/$name.err" >&2; return 1; }
}

echo "# hosts: host0 $(sim_host_addr 0), host1 $(sim_host_addr 1) (veth pairs into one bridge)" >&2
for ((i = 1; i <= runs; ++i)); do
  job plain -- "${bench[@]}" || exit 1
  job tls "${tls[@]}" -- "${bench[@]}" || exit 1
  store_job store_plain || exit 1
  store_job store_tls "${tls[@]}" || exit 1
  echo "round $i/$runs done" >&2
done

echo "# bench/tls_bench.sh $runs: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), median of $runs rounds"
echo "# ${bench[*]#$root/}, plain vs with TROUPE_TLS_CERT/KEY/CA (P-256 certificates)"
echo "# ${store[*]#$root/} on host0, plain vs the same variables"
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
d = Path(sys.argv[1])
def rows(name):
    return [json.loads(l) for l in (d / f"{name}.jsonl").read_text().splitlines() if l.startswith("{")]
def vals(rs, fig, **m):
    return [r[fig] for r in rs if fig in r and all(r.get(k) == v for k, v in m.items())]
def cell(vs):
    m = statistics.median(vs)
    f = (lambda v: f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}")
    return f"{f(m)} ({f(min(vs))}..{f(max(vs))})"
plain, tls = rows("plain"), rows("tls")
store_plain, store_tls = rows("store_plain"), rows("store_tls")
print("| measurement | plain | TLS | TLS/plain |")
print("|---|---|---|---|")
def line(what, fig, unit, pair=(plain, tls), **m):
    p, t = vals(pair[0], fig, **m), vals(pair[1], fig, **m)
    if p and t:
        print(f"| {what} | {cell(p)} {unit} | {cell(t)} {unit} | {statistics.median(t) / statistics.median(p):.2f} |")
line("RPC no-op p50", "p50_us", "µs", bench="roundtrip", variant="rpc")
line("RPC no-op p99", "p99_us", "µs", bench="roundtrip", variant="rpc")
line("RPC no-op, 64 in flight", "calls_per_s", "calls/s", bench="async")
line("echo 1 MiB", "GBps", "GB/s", bench="echo", variant="rpc", bytes=1048576)
line("echo 16 MiB", "GBps", "GB/s", bench="echo", variant="rpc", bytes=16777216)
line("raw TCP ping-pong p50 (never TLS)", "p50_us", "µs", bench="roundtrip", variant="raw_tcp")
line("raw TCP echo 16 MiB (never TLS)", "GBps", "GB/s", bench="echo", variant="raw_tcp", bytes=16777216)
store = (store_plain, store_tls)
line("store set and get (each a round trip), 1 client, host0 loopback TCP", "ops_per_s", "ops/s", store, bench="ops", clients=1)
line("store set_nowait and get, 1 client", "ops_per_s", "ops/s", store, bench="ops_nowait", clients=1)
line("store wake-up p50, 1 waiter", "p50_us", "µs", store, bench="wake", clients=1)
PY
