#!/usr/bin/env bash
# sim_hosts.sh: N simulated hosts on one machine, for the multihost tests.
#
# Each host is a holder process in its own network, UTS (hostname) and mount namespace,
# with a private tmpfs on /dev/shm and /tmp and a private /etc/hosts that maps every
# host's name to its address, so neither shared memory, files in /tmp, abstract Unix
# sockets nor loopback cross hosts. The hosts' eth0 are veth pairs into a bridge that
# lives in a namespace of its own (nothing is added to the root namespace), on the
# private subnet 10.213.0.0/24. With an etcd host, etcd runs there on 10.213.0.254:2379.
# A checkout (and its build) under /tmp stays visible on every host at the same path
# (sim_hosts_shared_tmp_dirs); the rest of /tmp is private to each host.
#
# As a library (tests source it; needs root, unshare, nsenter, ip):
#   source sim_hosts.sh
#   sim_hosts_check || exit 77          # prints why namespaces cannot be made
#   sim_hosts_up 2 [--etcd]             # host0, host1 (10.213.0.1, .2) [+ etcd host]
#   sim_host 1 cmd args...              # runs cmd on host1 (foreground)
#   sim_host_addr 1                     # 10.213.0.2
#   sim_host_cut 1 / sim_host_heal 1    # link down / up: a partition
#   sim_hosts_down                      # also runs on EXIT, INT and TERM
# By hand:
#   tests/multihost/sim_hosts.sh shell 2 [--etcd]   # one shell per host, see docs/testing.md
#
# Every holder dies with the shell that made it (parent-death signal) and at the latest
# after SIM_HOSTS_LIFETIME seconds (default 600), and the harness's directory (the hosts
# file, logs) goes with the bridge's holder, so nothing outlives a killed test.

SIM_HOSTS_SUBNET=${SIM_HOSTS_SUBNET:-10.213.0}
SIM_HOSTS_LIFETIME=${SIM_HOSTS_LIFETIME:-600}
SIM_HOSTS_ETCD_PORT=2379
sim_hosts_pids=()   # holder pid per host index
sim_hosts_last_pid=""
sim_hosts_last_outer=""
sim_hosts_outer=()      # the unshare parents of the holders
sim_hosts_bridge_pid=""
sim_hosts_etcd_pid=""
sim_hosts_etcd_host=""
sim_hosts_dir=""
sim_hosts_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The directories under /tmp that every host must still see through its private /tmp:
# the one holding this checkout (a clone under /tmp builds and runs there), the working
# directory, and any listed in SIM_HOSTS_SHARE (space-separated). Each is the first
# component below /tmp, shared as it is; everything else in /tmp stays private per host.
sim_hosts_shared_tmp_dirs() {
  local p r
  for p in "$sim_hosts_here" "$PWD" ${SIM_HOSTS_SHARE:-}; do
    case $p in
      /tmp/?*) r=${p#/tmp/}; echo "/tmp/${r%%/*}" ;;
    esac
  done | sort -u | head -n 7 | tr '\n' ' '   # fds 3 to 9 carry them into the host
}

sim_hosts_bridge_script=$(cat <<'EOF'
s=""
trap 'kill -KILL $s 2>/dev/null; rm -rf "$1"; exit 0' TERM
ip link add br0 type bridge && ip link set br0 up && ip link set lo up || exit 1
sleep "$0" &
s=$!
wait "$s"
rm -rf "$1"
EOF
)

# sim_hosts_check: returns 0 when hosts can be made here, else prints the reason.
sim_hosts_check() {
  local tool
  for tool in unshare nsenter ip setpriv mount; do
    command -v "$tool" >/dev/null 2>&1 || {
      echo "sim_hosts: '$tool' is missing (install util-linux and iproute2)"
      return 1
    }
  done
  if [[ $(id -u) -ne 0 ]]; then
    echo "sim_hosts: network namespaces need root (run the multihost tests as root)"
    return 1
  fi
  local why
  if ! why=$(unshare --net --uts --mount --propagation private \
               sh -c 'mount -t tmpfs none /dev/shm && ip link add t0 type veth peer name t1' 2>&1); then
    echo "sim_hosts: cannot create namespaces here: ${why:-unshare failed}"
    return 1
  fi
  return 0
}

sim_host_addr() {
  if [[ "$1" == etcd ]]; then echo "$SIM_HOSTS_SUBNET.254"; else echo "$SIM_HOSTS_SUBNET.$(($1 + 1))"; fi
}
sim_host_name() {
  if [[ "$1" == etcd ]]; then echo etcd; else echo "host$1"; fi
}
sim_hosts_etcd_endpoint() { echo "$(sim_host_addr etcd):$SIM_HOSTS_ETCD_PORT"; }

# Holder pid of host $1 (an index or "etcd").
sim_host_pid() {
  if [[ "$1" == etcd ]]; then echo "$sim_hosts_etcd_host"; else echo "${sim_hosts_pids[$1]}"; fi
}

# sim_host HOST cmd...: runs cmd inside that host's namespaces, in the current directory.
sim_host() {
  local pid
  pid=$(sim_host_pid "$1") || return 1
  shift
  [[ -n "$pid" ]] || { echo "sim_host: no such host" >&2; return 1; }
  nsenter -t "$pid" -n -u -m -p --wd="$PWD" -- "$@"
}

# One holder: new network, UTS, mount and pid namespaces; private /etc/hosts, /dev/shm,
# /tmp and /proc; its hostname. The holder (`sleep`) is pid 1 of the host, so killing it
# kills every process started on the host. Sets sim_hosts_last_pid (the holder, for
# nsenter) and sim_hosts_last_outer (its unshare parent, this shell's child). No command
# substitution: the unshare must be this shell's child, or its parent-death signal would
# fire when a subshell ends.
sim_hosts_start_holder() {
  local name=$1
  setpriv --pdeathsig KILL -- unshare --net --uts --mount --pid --fork --kill-child \
    --mount-proc --propagation private \
    sh -c 'mount --bind "$0/hosts" /etc/hosts && mount -t tmpfs -o size=256m tmpfs /dev/shm &&
           n=3; for d in $3; do eval "exec $n<\"\$d\"" || exit 1; n=$((n + 1)); done
           mount -t tmpfs -o size=256m tmpfs /tmp || exit 1
           n=3; for d in $3; do
             mkdir -p "$d" && mount --no-canonicalize --bind "/proc/self/fd/$n" "$d" && eval "exec $n<&-" || exit 1
             n=$((n + 1))
           done
           hostname "$1" && exec sleep "$2"' \
    "$sim_hosts_dir" "$name" "$SIM_HOSTS_LIFETIME" "$(sim_hosts_shared_tmp_dirs)" \
    2>"$sim_hosts_dir/$name.log" &
  sim_hosts_last_outer=$!
  sim_hosts_last_pid=""
  local i inner
  for ((i = 0; i < 100; ++i)); do
    inner=$(cat "/proc/$sim_hosts_last_outer/task/$sim_hosts_last_outer/children" 2>/dev/null)
    inner=${inner%% *}
    if [[ -n "$inner" && "$(nsenter -t "$inner" -u hostname 2>/dev/null)" == "$name" ]]; then
      sim_hosts_last_pid=$inner
      nsenter -t "$inner" -n ip link set lo up && return 0
      break
    fi
    kill -0 "$sim_hosts_last_outer" 2>/dev/null || break
    sleep 0.05
  done
  echo "sim_hosts: host '$name' did not come up: $(cat "$sim_hosts_dir/$name.log")" >&2
  kill -KILL "$sim_hosts_last_outer" $inner 2>/dev/null
  return 1
}

# Wires the host with holder $1 into the bridge as $2/24 on its eth0.
sim_hosts_wire() {
  local pid=$1 addr=$2 port=$3
  nsenter -t "$sim_hosts_bridge_pid" -n ip link add "$port" type veth peer name eth0 netns "$pid" &&
    nsenter -t "$sim_hosts_bridge_pid" -n ip link set "$port" master br0 up &&
    nsenter -t "$pid" -n ip addr add "$addr/24" dev eth0 &&
    nsenter -t "$pid" -n ip link set eth0 up
}

# sim_hosts_up N [--etcd]: makes host0..host(N-1) (and an etcd host running etcd).
sim_hosts_up() {
  local n=$1 with_etcd=${2:-} i
  if ((n < 1 || n > 16)); then echo "sim_hosts_up: 1 to 16 hosts, not '$n'" >&2; return 1; fi
  trap sim_hosts_down EXIT
  trap 'sim_hosts_down; exit 130' INT
  trap 'sim_hosts_down; exit 143' TERM
  sim_hosts_dir=$(mktemp -d "${TMPDIR:-/tmp}/sim_hosts.$$.XXXXXX") || return 1
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < n; ++i)); do echo "$(sim_host_addr $i) $(sim_host_name $i)"; done
    echo "$(sim_host_addr etcd) etcd"
  } >"$sim_hosts_dir/hosts"
  # The bridge's holder also removes the harness's directory when it ends, even when the
  # shell that made it was killed (its parent-death signal is TERM, which it traps).
  setpriv --pdeathsig TERM -- unshare --net sh -c "$sim_hosts_bridge_script" \
    "$SIM_HOSTS_LIFETIME" "$sim_hosts_dir" &
  sim_hosts_bridge_pid=$!
  for ((i = 0; i < 100; ++i)); do
    nsenter -t "$sim_hosts_bridge_pid" -n ip link show br0 >/dev/null 2>&1 && break
    sleep 0.05
  done
  for ((i = 0; i < n; ++i)); do
    sim_hosts_start_holder "$(sim_host_name $i)" || return 1
    sim_hosts_pids[i]=$sim_hosts_last_pid
    sim_hosts_outer+=("$sim_hosts_last_outer")
    sim_hosts_wire "$sim_hosts_last_pid" "$(sim_host_addr $i)" "p$i" || return 1
  done
  if [[ "$with_etcd" == --etcd ]]; then
    sim_hosts_start_holder etcd || return 1
    sim_hosts_etcd_host=$sim_hosts_last_pid
    sim_hosts_outer+=("$sim_hosts_last_outer")
    sim_hosts_wire "$sim_hosts_etcd_host" "$(sim_host_addr etcd)" petcd || return 1
    sim_hosts_start_etcd || return 1
  fi
}

sim_hosts_start_etcd() {
  local bin=${TROUPE_ETCD_BINARY:-/usr/bin/etcd} addr
  [[ -x "$bin" ]] || { echo "sim_hosts: etcd not found at $bin (apt-get install etcd-server)" >&2; return 1; }
  addr=$(sim_host_addr etcd)
  sim_host etcd "$bin" --name etcd --data-dir /tmp/etcd-data \
    --listen-client-urls "http://$addr:$SIM_HOSTS_ETCD_PORT" \
    --advertise-client-urls "http://$addr:$SIM_HOSTS_ETCD_PORT" \
    --listen-peer-urls "http://$addr:2380" --initial-advertise-peer-urls "http://$addr:2380" \
    --initial-cluster "etcd=http://$addr:2380" >"$sim_hosts_dir/etcd.log" 2>&1 &
  sim_hosts_etcd_pid=$!
  local i
  for ((i = 0; i < 200; ++i)); do
    if sim_host etcd bash -c "exec 3<>/dev/tcp/$addr/$SIM_HOSTS_ETCD_PORT" 2>/dev/null; then
      return 0
    fi
    kill -0 "$sim_hosts_etcd_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "sim_hosts: etcd did not answer on $addr:$SIM_HOSTS_ETCD_PORT; its log:" >&2
  cat "$sim_hosts_dir/etcd.log" >&2
  return 1
}

sim_host_cut() { nsenter -t "$(sim_host_pid "$1")" -n ip link set eth0 down; }
sim_host_heal() { nsenter -t "$(sim_host_pid "$1")" -n ip link set eth0 up; }

# sim_hosts_down: kills the holders, and with them every process on the hosts (each is
# pid 1 of its host), then the bridge; idempotent.
sim_hosts_down() {
  local pid
  for pid in "${sim_hosts_pids[@]}" "$sim_hosts_etcd_host"; do
    [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null
  done
  [[ -n "$sim_hosts_bridge_pid" ]] && kill -TERM "$sim_hosts_bridge_pid" 2>/dev/null
  for pid in "${sim_hosts_outer[@]}" "$sim_hosts_bridge_pid"; do
    [[ -n "$pid" ]] && wait "$pid" 2>/dev/null
  done
  sim_hosts_pids=()
  sim_hosts_outer=()
  sim_hosts_etcd_host=""
  sim_hosts_bridge_pid=""
  sim_hosts_etcd_pid=""
  [[ -n "$sim_hosts_dir" ]] && rm -rf "$sim_hosts_dir"
  sim_hosts_dir=""
  return 0
}

# By hand: sim_hosts.sh shell N [--etcd]
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  if [[ "${1:-}" != shell || -z "${2:-}" ]]; then
    echo "usage: $0 shell N [--etcd]   (one interactive shell per host, in turn)" >&2
    exit 2
  fi
  sim_hosts_check || exit 77
  sim_hosts_up "$2" "${3:-}" || exit 1
  echo "hosts: $(cat "$sim_hosts_dir/hosts" | tr '\n' ';')"
  [[ -n "$sim_hosts_etcd_host" ]] && echo "etcd: $(sim_hosts_etcd_endpoint)"
  echo "holders (enter with: nsenter -t PID -n -u -m -p --wd=\"\$PWD\" bash): ${sim_hosts_pids[*]} ${sim_hosts_etcd_host}"
  echo "a shell on host0 follows; exit it to tear everything down"
  sim_host 0 bash -i
fi
