#!/usr/bin/env bash
# The simulated hosts are really separate: each has its own hostname that every host
# resolves, its own /dev/shm, /tmp, abstract Unix sockets, loopback and processes; hosts
# reach each other only over the bridge, a cut link cuts a host off, etcd answers on its
# own host, and nothing is left behind, whether the harness ends normally or is killed.
# Exit 77 (skipped) when namespaces cannot be made here.
set -u
here=$(cd "$(dirname "$0")" && pwd)
source "$here/sim_hosts.sh"
reason=$(sim_hosts_check) || { echo "[troupe-skip] $reason"; exit 77; }
command -v python3 >/dev/null || { echo "[troupe-skip] python3 is missing"; exit 77; }

failures=0
check() {  # check "sentence" command...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
fails() { ! "$@" 2>/dev/null; }

sim_hosts_up 3 --etcd || { echo "FAILED: the hosts could not be made"; exit 1; }

check "each host has its own hostname" \
  test "$(sim_host 0 hostname)/$(sim_host 1 hostname)/$(sim_host 2 hostname)" = "host0/host1/host2"
check "every host resolves every host's name to its bridge address" \
  test "$(sim_host 2 getent hosts host0 | cut -d' ' -f1)" = "$(sim_host_addr 0)"
check "a host resolves its own name to its bridge address, not loopback" \
  test "$(sim_host 1 getent hosts host1 | cut -d' ' -f1)" = "$(sim_host_addr 1)"

sim_host 0 sh -c 'echo a > /dev/shm/troupe-iso && echo a > /tmp/troupe-iso'
check "a file in /dev/shm on host0 is there on host0" sim_host 0 test -e /dev/shm/troupe-iso
check "a file in /dev/shm on host0 is not visible on host1" fails sim_host 1 test -e /dev/shm/troupe-iso
check "a file in /dev/shm on host0 is not visible outside the hosts" fails test -e /dev/shm/troupe-iso
check "a file in /tmp on host0 is not visible on host1" fails sim_host 1 test -e /tmp/troupe-iso
check "a host sees only its own processes" test "$(sim_host 1 ps -e --no-headers | wc -l)" -le 3

# A server on host0 that accepts one connection on an abstract Unix socket, on loopback
# and on its bridge address; the clients below say whether they got through.
serve='
import socket, sys, time
kind, where = sys.argv[1], sys.argv[2]
if kind == "abstract":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind("\0" + where)
else:
    host, port = where.rsplit(":", 1)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, int(port)))
s.listen(8); s.settimeout(20)
print("listening", flush=True)
try:
    while True: c, _ = s.accept(); c.close()
except socket.timeout: pass'
connect='
import socket, sys
kind, where = sys.argv[1], sys.argv[2]
if kind == "abstract":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(3); s.connect("\0" + where)
else:
    host, port = where.rsplit(":", 1)
    s = socket.socket(); s.settimeout(3); s.connect((host, int(port)))'
start_server() {  # start_server HOST KIND WHERE: returns once it listens
  local fifo=$sim_hosts_dir/ready.$RANDOM line
  mkfifo "$fifo"
  sim_host "$1" python3 -c "$serve" "$2" "$3" >"$fifo" &
  read -r -t 10 line <"$fifo"
  rm -f "$fifo"
  [[ "$line" == listening ]]
}
connects() { sim_host "$1" timeout 10 python3 -c "$connect" "$2" "$3" 2>/dev/null; }

start_server 0 abstract troupe-iso-$$ || echo "FAILED: the abstract-socket server did not start"
check "an abstract socket bound on host0 is reachable on host0" connects 0 abstract troupe-iso-$$
check "an abstract socket bound on host0 is not reachable from host1" fails connects 1 abstract troupe-iso-$$
check "an abstract socket bound on host0 is not reachable outside the hosts" \
  fails timeout 10 python3 -c "$connect" abstract troupe-iso-$$

start_server 0 tcp 127.0.0.1:29400 || echo "FAILED: the loopback server did not start"
check "host0's loopback is reachable on host0" connects 0 tcp 127.0.0.1:29400
check "host0's loopback is not host1's loopback" fails connects 1 tcp 127.0.0.1:29400

a0=$(sim_host_addr 0)
start_server 0 tcp "$a0:29401" || echo "FAILED: the bridge-address server did not start"
check "host1 reaches host0 over the bridge" connects 1 tcp "$a0:29401"
check "host2 reaches host0 by its name" connects 2 tcp "host0:29401"
sim_host_cut 1
check "a host whose link is down cannot reach the others" fails connects 1 tcp "$a0:29401"
check "the others still reach each other while one host is cut off" connects 2 tcp "$a0:29401"
sim_host_heal 1
check "a healed link reaches the others again" connects 1 tcp "$a0:29401"

check "etcd answers on its own host, from every host" \
  sim_host 2 timeout 10 python3 -c "$connect" tcp "$(sim_hosts_etcd_endpoint)"
check "etcd is not running on the hosts themselves" fails connects 0 tcp "127.0.0.1:2379"

# Teardown: normal exit, SIGTERM and SIGKILL of the shell that made the hosts all leave
# no process and no namespace behind.
holders_file=$sim_hosts_dir/teardown-pids
for how in exit TERM KILL; do
  bash -c '
    source "$1/sim_hosts.sh"
    sim_hosts_up 2 --etcd || exit 1
    sim_host 0 sleep 300 &
    sim_host 1 sleep 300 &
    sleep 0.5
    inside=()
    for h in "${sim_hosts_pids[@]}" "$sim_hosts_etcd_host"; do
      ns=$(readlink "/proc/$h/ns/net")
      for p in /proc/[0-9]*; do
        [[ "$(readlink "$p/ns/net" 2>/dev/null)" == "$ns" ]] && inside+=("${p#/proc/}")
      done
    done
    echo "$sim_hosts_dir ${inside[*]} $sim_hosts_bridge_pid ${sim_hosts_outer[*]}" >"$2"
    [[ "$3" == exit ]] && exit 0
    kill -"$3" $$; sleep 30' _ "$here" "$holders_file" "$how" >/dev/null 2>&1
  read -r dir pids_line <"$holders_file"
  read -r -a pids <<<"$pids_line"
  gone=1
  for ((i = 0; i < 50; ++i)); do
    gone=1
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && gone=0; done
    [[ -e "$dir" ]] && gone=0
    ((gone)) && break
    sleep 0.1
  done
  check "after $how of the harness's shell, none of the ${#pids[@]} processes it made or ran on its hosts, nor its directory, is left" \
    test "$gone" = 1 -a "${#pids[@]}" -ge 10
done

sim_hosts_down
echo "isolation: $failures failure(s)"
((failures == 0))
