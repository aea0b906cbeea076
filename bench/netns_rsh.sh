#!/usr/bin/env bash
# The "remote shell" that lets Open MPI's mpirun start its daemons on the simulated hosts of
# tests/multihost/sim_hosts.sh (bench/hosts_bench.sh passes it as --mca plm_rsh_agent):
#   netns_rsh.sh HOST COMMAND...
# runs COMMAND, a shell command line as rsh would take it, inside HOST's network, UTS,
# mount and pid namespaces. SIM_HOSTS_PIDS maps host names to the pids that hold their
# namespaces ("host0=123,host1=456"). Reaches nothing outside those hosts.
set -euo pipefail
host=${1:?usage: netns_rsh.sh HOST COMMAND...}
shift
pid=""
IFS=, read -ra pairs <<< "${SIM_HOSTS_PIDS:?netns_rsh.sh: SIM_HOSTS_PIDS is not set}"
for p in "${pairs[@]}"; do
  [[ ${p%%=*} == "$host" ]] && pid=${p#*=}
done
[[ -n $pid ]] || { echo "netns_rsh.sh: no simulated host '$host' in SIM_HOSTS_PIDS=$SIM_HOSTS_PIDS" >&2; exit 255; }
exec nsenter -t "$pid" -n -u -m -p -- /bin/sh -c "$*"
