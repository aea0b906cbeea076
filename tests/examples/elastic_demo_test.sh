#!/usr/bin/env bash
# The README's elastic job: train_demo under troupe-run --failure-policy replace with
# --kill-one, for several seeds (each kills another worker at another step). Every run must
# finish, replace the killed worker without restarting the others, keep the loss falling,
# and end with identical weights that match a single-process replay of its world sizes.
#   elastic_demo_test.sh TROUPE_RUN TRAIN_DEMO SEED...
set -u
troupe_run=$1 demo=$2
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
for seed in "$@"; do
  out=$(timeout 120 "$troupe_run" --standalone --nproc-per-node 4 --failure-policy replace \
    --max-restarts 1 --log-dir "$tmp/logs" "$demo" --kill-one --seed "$seed" --timeout 30s 2>&1)
  rc=$?
  why=""
  if ((rc != 0)); then why="exit code $rc"
  elif ! grep -q "killing itself with SIGKILL at step" <<<"$out"; then why="no worker was killed"
  elif ! grep -q "replacing worker rank [0-9] (replacement 1 of 1); the other workers run on" <<<"$out"; then
    why="troupe-run did not replace the killed worker"
  elif grep -q "restarting the worker group" <<<"$out"; then why="the worker group was restarted"
  elif ! grep -q "all 4 worker(s) hold identical weights.*matches a single-process replay" <<<"$out"; then
    why="no final check of identical weights against the replay"
  else
    first=$(grep -o "epoch 1/[0-9]*: loss [0-9.]*" <<<"$out" | head -1 | awk '{print $4}')
    last=$(grep -o "epoch [0-9]*/[0-9]*: loss [0-9.]*" <<<"$out" | tail -1 | awk '{print $4}')
    if [[ -z "$first" || -z "$last" ]] || ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
      why="the loss did not fall (first epoch '$first', last '$last')"
    fi
  fi
  if [[ -n "$why" ]]; then
    echo "FAILED, seed $seed: $why"
    echo "$out" | tail -n 60
    failures=$((failures + 1))
  else
    echo "seed $seed: $(grep -o 'worker[0-9] will kill itself with SIGKILL at step [0-9]*' <<<"$out"); loss $first -> $last; $(grep -o 'max |w - w_replay| = [^ ]*' <<<"$out"), $(grep -o 'steps discarded here: [0-9]*' <<<"$out")"
  fi
done
echo "$failures failure(s)"
((failures == 0))
