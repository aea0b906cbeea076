#!/usr/bin/env bash
# Recovery from a killed worker: troupe's live resize against torchrun's restart of the
# whole group, the same training on both (a 16-64-4 MLP, 320 global steps of 128 samples,
# 4 workers), alternating, ROUNDS rounds each; medians.
#
#   troupe: troupe-run --failure-policy replace ... train_demo --kill-one --seed R
#           --recovery-report: the killed worker is replaced while the others train on.
#   torch:  torchrun --max_restarts 1 --monitor_interval 0.1 bench/elastic_torchrun.py
#           (DDP over gloo, a checkpoint after every step; torch 1.13 on Python 3.11
#           needs explicit --redirects/--tee values): every worker restarts,
#           re-initialises and loads the checkpoint. It is killed at the step troupe's run
#           of the same round was.
#
# Figures per run, from the "recovery:" lines (wall-clock times on this one host):
#   kill -> next step    from the SIGKILL to the first step any worker completes after it
#   start -> first step  from a (re)started worker's start (the top of its main, before
#                        troupe::init; the top of the script, before importing torch) to
#                        its first completed step
#   steps lost           the kill step minus the first step completed after the kill, plus
#                        one: 1 when only the step in flight is redone (troupe discards it
#                        on every survivor; torchrun's checkpoint is written every step)
#
#   bench/elastic_bench.sh [ROUNDS]        (from the repository root, after a release build)
set -u
rounds=${1:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
run=$root/build/release/launcher/troupe-run
demo=$root/build/release/examples/train/train_demo
py=/usr/bin/python3
[[ -x "$run" && -x "$demo" ]] || { echo "build first: scripts/build.sh release"; exit 1; }
command -v torchrun >/dev/null || { echo "torchrun not found (apt: python3-torch)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# "kill->next start->first lost" from one run's output ($1) and the victim's name ($2).
figures() {
  "$py" - "$1" "$2" <<'EOF'
import re, sys
text, victim = open(sys.argv[1]).read(), sys.argv[2]
kill = [int(m) for m in re.findall(r"recovery: \S+ killed at (\d+)", text)]
if not kill:
    print("nan nan nan"); sys.exit()
t_kill = kill[0]
done = [(w, int(s), int(t)) for w, s, t in
        re.findall(r"recovery: (\S+) completed step (\d+) at (\d+)", text)]
after = [t for w, s, t in done if t > t_kill]
starts = {w: int(t) for w, t in re.findall(r"recovery: (\S+) started at (\d+)", text)}
firsts = [min(t for w2, s, t in done if w2 == w and t > t0) - t0
          for w, t0 in starts.items() if any(w2 == w and t > t0 for w2, s, t in done)]
ks = int(re.search(r"killed at \d+ \(step (\d+)\)", text).group(1))
resumed = min(s for w, s, t in done if t > t_kill)
lost = ks - resumed + 1
print(f"{(min(after) - t_kill) / 1e6 if after else float('nan'):.1f} "
      f"{min(firsts) / 1e6 if firsts else float('nan'):.1f} {lost}")
EOF
}

declare -a troupe_kn troupe_sf troupe_lost torch_kn torch_sf torch_lost
for ((r = 1; r <= rounds; ++r)); do
  out=$tmp/troupe.$r
  "$run" --standalone --nproc-per-node 4 --failure-policy replace --max-restarts 1 \
    --log-dir "$tmp/logs" "$demo" --kill-one --seed "$r" --recovery-report >"$out" 2>&1 ||
    { echo "troupe run $r failed:"; tail -20 "$out"; exit 1; }
  victim=$(grep -o "worker[0-9]* will kill itself" "$out" | head -1 | cut -d' ' -f1)
  step=$(grep -o "at step [0-9]*" "$out" | head -1 | awk '{print $3}')
  read -r kn sf lost <<<"$(figures "$out" "$victim")"
  troupe_kn+=("$kn") troupe_sf+=("$sf") troupe_lost+=("$lost")

  out=$tmp/torch.$r
  rm -rf "$tmp/ckpt" && mkdir -p "$tmp/ckpt"
  torchrun --standalone --nproc_per_node 4 --max_restarts 1 --monitor_interval 0.1 \
    --redirects=9:1 --tee=9:1 \
    "$root/bench/elastic_torchrun.py" --ckpt "$tmp/ckpt" --victim "${victim#worker}" \
    --kill-step "$step" >"$out" 2>&1 || { echo "torchrun run $r failed:"; tail -20 "$out"; exit 1; }
  read -r kn sf lost <<<"$(figures "$out" "$victim")"
  torch_kn+=("$kn") torch_sf+=("$sf") torch_lost+=("$lost")
  echo "round $r ($victim killed at step $step): troupe kill->next ${troupe_kn[-1]} ms, start->first ${troupe_sf[-1]} ms, lost ${troupe_lost[-1]}; torchrun kill->next $kn ms, start->first $sf ms, lost $lost"
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }
tk=$(median "${troupe_kn[@]}") ts=$(median "${troupe_sf[@]}") tl=$(median "${troupe_lost[@]}")
pk=$(median "${torch_kn[@]}") ps=$(median "${torch_sf[@]}") pl=$(median "${torch_lost[@]}")
echo
echo "command: bench/elastic_bench.sh $rounds    ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ))"
echo "| measurement (median of $rounds) | troupe (replace) | torchrun (restart all) | troupe/torchrun |"
echo "|---|---|---|---|"
awk -v a="$tk" -v b="$pk" 'BEGIN { printf "| SIGKILL -> next completed step | %.1f ms | %.1f ms | %.3f |\n", a, b, a / b }'
awk -v a="$ts" -v b="$ps" 'BEGIN { printf "| (re)started worker: start -> first step | %.1f ms | %.1f ms | %.3f |\n", a, b, a / b }'
echo "| steps lost per failure | $tl | $pl | |"
