# jobs.sh: running one command per simulated host and judging the outcome, for the
# multihost tests (source after sim_hosts.sh).
#   mh_skip_unless_hosts               exits 77 with the reason when hosts cannot be made
#   mh_start NAME HOST SECONDS cmd...  runs cmd on HOST in the background, killed after
#                                      SECONDS; its output goes to the log NAME
#   mh_wait NAME                       waits for it and returns its exit status
#   mh_signal NAME HOST SIGNAL         sends SIGNAL to that command itself (by the pid it
#                                      wrote in HOST's private /tmp), e.g. a launcher
#   mh_log NAME                        prints its output
#   mh_expect "sentence" cmd...        records a check; mh_finish prints every log on
#                                      failure and exits with the verdict

mh_failures=0
declare -A mh_pids=()
mh_logs_dir=""

mh_skip_unless_hosts() {
  local reason
  reason=$(sim_hosts_check) || { echo "[troupe-skip] $reason"; exit 77; }
}

# The logs live in the harness's directory, which goes away with the hosts.
mh_start() {
  local name=$1 host=$2 seconds=$3
  shift 3
  mh_logs_dir=$sim_hosts_dir/logs
  mkdir -p "$mh_logs_dir"
  sim_host "$host" timeout -k 5 "$seconds" \
    sh -c 'echo $$ >"/tmp/mh-$0.pid" && exec "$@"' "$name" "$@" >"$mh_logs_dir/$name.log" 2>&1 &
  mh_pids[$name]=$!
}

mh_signal() {
  sim_host "$2" sh -c 'kill -"$1" "$(cat "/tmp/mh-$0.pid")"' "$1" "$3"
}

mh_wait() { wait "${mh_pids[$1]}"; }
mh_log() { cat "$mh_logs_dir/$1.log"; }

mh_expect() {
  local what=$1
  shift
  if "$@"; then
    echo "ok: $what"
  else
    echo "FAILED: $what"
    mh_failures=$((mh_failures + 1))
  fi
}

mh_finish() {
  local f
  if ((mh_failures > 0)); then
    for f in "$mh_logs_dir"/*.log; do
      [[ -e "$f" ]] || continue
      echo "---- $(basename "$f" .log)"
      tail -n 60 "$f"
    done
  fi
  sim_hosts_down
  echo "$mh_failures failure(s)"
  ((mh_failures == 0))
  exit
}
