#!/usr/bin/env bash
# Packs everything a lent GPU machine needs to run troupe's GPU tests and benchmarks into
# one folder, with nothing to install there: the stripped gpu-labelled test binaries,
# nccl_bench and rpc_bench, the shared libraries they need that such a machine lacks
# (CAF, Gloo and the like, found with ldd), and run.sh (scripts/gpu-run.sh), which finds
# CUDA's runtime and NCCL there, runs every GPU test case and benchmark and prints a
# summary. The device machine has the NVIDIA driver, CUDA under /usr/local/cuda and NCCL
# as the Python package nvidia-nccl-cu13; libc and libstdc++ are its own.
#
#   bash scripts/gpu-bundle.sh [--build-dir DIR] [--out DIR] [--no-build]
#
# Defaults: build/release (built first with its GPU targets unless --no-build) and
# build/gpu-bundle. Fails when the build has no CUDA (TROUPE_HAVE_CUDA off), when a
# binary is missing, or when the bundle exceeds 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/release
out=build/gpu-bundle
do_build=1
while (($#)); do
  case $1 in
    --build-dir) build=${2:?--build-dir needs a folder}; shift 2 ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
limit_mib=60

if ((do_build)); then
  # The demo's build configures the same folder without tests; the bundle needs them.
  if [[ ! -f $build/CMakeCache.txt ]] || ! grep -q '^TROUPE_BUILD_TESTS:BOOL=ON' "$build/CMakeCache.txt" ||
    ! grep -q '^TROUPE_BUILD_BENCH:BOOL=ON' "$build/CMakeCache.txt"; then
    if [[ $build == build/release ]]; then
      cmake --preset release -DTROUPE_BUILD_TESTS=ON -DTROUPE_BUILD_BENCH=ON >/dev/null
    else
      cmake -S . -B "$build" -DTROUPE_BUILD_TESTS=ON -DTROUPE_BUILD_BENCH=ON >/dev/null
    fi
  fi
  cmake --build "$build" -j"${TROUPE_BUILD_JOBS:-$(nproc)}" \
    --target core_gpu_tests collectives_gpu_tests rpc_gpu_tests training_gpu_tests nccl_bench rpc_bench rpc_gpu_bench >/dev/null
fi
# The gpu-labelled test binaries, as CTest knows them.
mapfile -t tests < <(ctest --test-dir "$build" -L gpu --show-only=json-v1 2>/dev/null |
  python3 -c 'import json, sys
seen = []
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if cmd and cmd[0] not in seen:
        seen.append(cmd[0])
print("\n".join(seen))')
# collectives_gpu_tests exists only in a build configured with CUDA and NCCL.
if ! printf '%s\n' "${tests[@]}" | grep -q '/collectives_gpu_tests$'; then
  echo "gpu-bundle: $build was configured without CUDA and NCCL (no collectives_gpu_tests);" \
    "install CUDA under /usr/local/cuda with NCCL and configure again" >&2
  exit 1
fi
benches=("$build/bench/nccl_bench" "$build/bench/rpc_bench" "$build/bench/rpc_gpu_bench")
for f in "${tests[@]}" "${benches[@]}"; do
  [[ -x $f ]] || { echo "gpu-bundle: $f is missing; build it first (drop --no-build)" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out/tests" "$out/bench" "$out/lib"
for f in "${tests[@]}"; do cp "$f" "$out/tests/"; done
for f in "${benches[@]}"; do cp "$f" "$out/bench/"; done
strip --strip-unneeded "$out"/tests/* "${benches[@]/#$build/$out}"

# Libraries the device lacks: everything ldd resolves except the C and C++ runtimes (the
# device's own are newer) and CUDA's runtime and NCCL (run.sh finds the device's).
system='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcudart\.so|libnccl\.so|libcuda\.so|libnvidia)'
for f in "$out"/tests/* "$out"/bench/*; do
  while read -r name _ path _; do
    [[ $path == /* ]] || continue
    [[ $name =~ $system ]] && continue
    [[ -e $out/lib/$name ]] || cp -L "$path" "$out/lib/$name"
  done < <(ldd "$f")
done
strip --strip-unneeded "$out"/lib/* 2>/dev/null || true
cp scripts/gpu-run.sh "$out/run.sh"
cp bench/rpc_gpu_tensorpipe.py "$out/bench/"
chmod +x "$out/run.sh"
git rev-parse --short HEAD >"$out/COMMIT" 2>/dev/null || echo unknown >"$out/COMMIT"

size_kib=$(du -sk "$out" | cut -f1)
echo "gpu-bundle: $out: ${#tests[@]} test binaries, ${#benches[@]} benchmarks," \
  "$(ls "$out/lib" | wc -l) libraries, $((size_kib / 1024)) MiB"
if ((size_kib > limit_mib * 1024)); then
  echo "gpu-bundle: the bundle is over ${limit_mib} MiB" >&2
  exit 1
fi
