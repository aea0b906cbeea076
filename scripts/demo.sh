#!/usr/bin/env bash
# The quick start: installs only what the demo build uses, builds only troupe-run and the
# demo (the `demo` preset: optimized, no debug info, no etcd backend, no tests or benchmarks,
# in build/demo), and runs the
# main demo job: four workers train a small MLP with DDP under troupe-run, with uneven
# shards handled by Join, and check that they end with identical weights matching a
# single-process run. scripts/test.sh builds and tests everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --demo
bash scripts/build.sh demo
exec build/demo/launcher/troupe-run --standalone --nproc-per-node 4 \
  build/demo/examples/train/train_demo
