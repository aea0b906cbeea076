#!/usr/bin/env bash
# run.sh of the GPU bundle (scripts/gpu-bundle.sh makes it): runs every GPU test case and
# benchmark in this folder on this machine and prints a summary. Nothing to install: it
# finds CUDA's runtime (libcudart.so.13) and NCCL (libnccl.so.2) in CUDA's folder or in the
# Python packages nvidia-cuda-runtime / nvidia-nccl-cu13, and the other libraries in lib/.
#
#   ./run.sh [--tests-only] [--case-timeout SECONDS]
#
# Each test case runs alone, so one crash costs one case. A case is: passed (it ran at
# least one assertion), skipped (it printed "[troupe-skip] reason"), or failed (non-zero
# exit, a timeout, or no assertion at all). Exit status: 0 when none failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tests_only=0
case_timeout=300
while (($#)); do
  case $1 in
    --tests-only) tests_only=1; shift ;;
    --case-timeout) case_timeout=${2:?--case-timeout needs seconds}; shift 2 ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# Folders that may hold a library: CUDA's, then the Python packages' (the device keeps NCCL
# only there), each searched once and bounded in depth.
find_lib() {  # name -> the folder holding it, or nothing
  local name=$1 d
  local dirs=(${TROUPE_CUDA_LIB_DIRS:-} /usr/local/cuda/lib64 /usr/local/cuda/lib
    /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
  local py
  for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    while read -r d; do dirs+=("$d"); done < <("$py" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "*", "lib64")):
        print(d)
EOF
    )
  done
  for d in "${dirs[@]}"; do
    [[ -e $d/$name ]] && { echo "$d"; return 0; }
  done
  # Last resort: a bounded search of the usual prefixes.
  d=$(timeout 20 find /usr /opt -maxdepth 8 -name "$name" -print -quit 2>/dev/null)
  [[ -n $d ]] && dirname "$d"
}

libpath=$here/lib
for name in libcudart.so.13 libnccl.so.2; do
  d=$(find_lib "$name")
  if [[ -n $d ]]; then
    echo "run.sh: $name from $d"
    libpath=$libpath:$d
  else
    echo "run.sh: $name not found (CUDA's folder or the nvidia Python packages); binaries that need it will fail to start"
  fi
done
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "run.sh: bundle of commit $(cat "$here/COMMIT" 2>/dev/null || echo unknown) on $(hostname)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | sed 's/^/run.sh: /'

passed=0 failed=0 skipped=0
failures=()
device_seen=0
for bin in "$here"/tests/*; do
  suite=$(basename "$bin")
  if missing=$(ldd "$bin" 2>/dev/null | grep 'not found'); [[ -n $missing ]]; then
    echo "FAIL $suite: cannot start, missing $(echo "$missing" | awk '{print $1}' | tr '\n' ' ')"
    failed=$((failed + 1))
    failures+=("$suite (missing libraries)")
    continue
  fi
  mapfile -t cases < <("$bin" -ltc --no-version 2>/dev/null | sed -n '/^=====/,/^=====/p' | grep -v '^=====')
  if ((${#cases[@]} == 0)); then
    echo "FAIL $suite: lists no test case"
    failed=$((failed + 1))
    failures+=("$suite (no test case)")
    continue
  fi
  for name in "${cases[@]}"; do
    filter=${name//,/\\,}
    out=$(timeout "$case_timeout" "$bin" -tc="$filter" --no-version 2>&1)
    rc=$?
    asserts=$(grep -o 'assertions: *[0-9]*' <<<"$out" | tail -1 | grep -o '[0-9]*$')
    if ((rc == 124)); then
      verdict=FAIL why="timed out after ${case_timeout}s"
    elif ((rc != 0)); then
      verdict=FAIL why="exit status $rc"
    elif grep -q '\[troupe-skip\]' <<<"$out"; then
      verdict=SKIP why=$(grep -m1 -o '\[troupe-skip\].*' <<<"$out" | sed 's/\[troupe-skip\] *//')
    elif [[ -z $asserts || $asserts == 0 ]]; then
      verdict=FAIL why="ran no assertion"
    else
      verdict=PASS why="$asserts assertions"
    fi
    echo "$verdict $suite: $name ($why)"
    case $verdict in
      PASS)
        passed=$((passed + 1))
        [[ $name == *"at least one device"* ]] && device_seen=1
        ;;
      SKIP) skipped=$((skipped + 1)) ;;
      FAIL)
        failed=$((failed + 1))
        failures+=("$suite: $name")
        sed 's/^/    | /' <<<"$out" | tail -40
        ;;
    esac
  done
done

echo "run.sh: gpu tests: $passed passed, $failed failed, $skipped skipped"
if ((!tests_only)); then
  if ((device_seen)); then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    world=$((gpus >= 2 ? 2 : 1))
    echo "run.sh: nccl_bench --world $world (our wrapper against raw NCCL, same program)"
    timeout 300 "$here/bench/nccl_bench" --world "$world" --min 8 --max $((256 << 20)) ||
      echo "run.sh: nccl_bench failed (status $?)"
    # RPC GPU -> GPU echo, ours and PyTorch's TensorPipe agent, alternating (noisy machines).
    tp_python=""
    for py in python3 /usr/bin/python3; do
      if command -v "$py" >/dev/null 2>&1 &&
        timeout 60 "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        tp_python=$py
        break
      fi
    done
    [[ -z $tp_python ]] && echo "run.sh: no python with torch and CUDA here: TensorPipe anchor skipped"
    for round in 1 2; do
      echo "run.sh: rpc_gpu_bench round $round (ours: two processes on cuda:0, map {cuda:0 -> cuda:0})"
      timeout 240 "$here/bench/rpc_gpu_bench" --iters 15 || echo "run.sh: rpc_gpu_bench failed (status $?)"
      timeout 240 "$here/bench/rpc_gpu_bench" --iters 15 --staged || echo "run.sh: rpc_gpu_bench --staged failed (status $?)"
      if [[ -n $tp_python ]]; then
        echo "run.sh: rpc_gpu_tensorpipe round $round ($($tp_python -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))"
        timeout 240 "$tp_python" "$here/bench/rpc_gpu_tensorpipe.py" --iters 15 ||
          echo "run.sh: rpc_gpu_tensorpipe failed (status $?)"
      fi
    done
    echo "run.sh: rpc_bench (CPU paths on this machine, for reference)"
    timeout 240 "$here/bench/rpc_bench" --iters 2000 --seconds 1 --sizes 4096,16777216 ||
      echo "run.sh: rpc_bench failed (status $?)"
  else
    echo "run.sh: benchmarks skipped: no CUDA device usable here (see the skipped tests' reasons)"
  fi
fi
if ((failed > 0)); then
  printf 'run.sh: failed: %s\n' "${failures[@]}"
  exit 1
fi
exit 0
