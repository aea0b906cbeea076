#!/usr/bin/env bash
# train_demo started as other launchers start workers, with no troupe-run: torchrun's
# environment (RANK, WORLD_SIZE, LOCAL_*, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID)
# and Slurm's (SLURM_PROCID, SLURM_NTASKS, ... with the node list giving the master). Rank 0
# hosts the store; every rank must train and pass the demo's own equality check. Then the
# failures a user meets: no store reachable, and a MASTER_ADDR that does not resolve.
#   foreign_launch_test.sh TRAIN_DEMO
set -u
demo=$1
failures=0
expect() {  # description, command...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
logs=$(mktemp -d "${TMPDIR:-/tmp}/foreign_launch.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$logs"' EXIT
# A free port for rank 0's store, from the kernel.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

port=$(free_port)
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$port" TORCHELASTIC_RUN_ID="foreign-$$" TORCHELASTIC_RESTART_COUNT=0 \
    timeout 60 "$demo" --epochs 2 --timeout 30s >"$logs/torchrun.$r.log" 2>&1 &
done
wait
expect "two ranks under torchrun's environment train and match a single-process run" \
  grep -q "the distributed run matches a single-process run" "$logs/torchrun.0.log"

port=$(free_port)
for r in 0 1; do
  env SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_NNODES=1 \
    SLURM_JOB_ID="$$" SLURM_STEP_NODELIST=localhost MASTER_PORT="$port" \
    timeout 60 "$demo" --epochs 2 --timeout 30s >"$logs/slurm.$r.log" 2>&1 &
done
wait
expect "two ranks under Slurm's environment train and match a single-process run" \
  grep -q "the distributed run matches a single-process run" "$logs/slurm.0.log"

port=$(free_port)
start=$(date +%s)
env RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
  TORCHELASTIC_RUN_ID="foreign-$$" timeout 60 "$demo" --timeout 3s >"$logs/nostore.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
expect "a rank with no store to reach fails" test "$rc" = 1
expect "it fails within its timeout, not the test's ($took s)" test "$took" -lt 30
expect "its message says where it looked and who hosts the store" \
  grep -q "no store at 127.0.0.1:$port after 3s: rank 0 hosts it" "$logs/nostore.log"

env RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT="$port" \
  timeout 60 "$demo" --timeout 30s >"$logs/noresolve.log" 2>&1
expect "a MASTER_ADDR that does not resolve is an error naming it" \
  grep -q "MASTER_ADDR='no-such-host.invalid' does not resolve" "$logs/noresolve.log"

if ((failures > 0)); then
  for f in "$logs"/*.log; do echo "---- $(basename "$f")"; cat "$f"; done
  echo "$failures failure(s)"
  exit 1
fi
