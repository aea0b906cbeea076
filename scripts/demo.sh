#!/usr/bin/env bash
# Installs dependencies, builds the release preset, and runs the main demo job: four
# workers train a small MLP with DDP under troupe-run, with uneven shards handled by Join,
# and check that they end with identical weights matching a single-process run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh release
exec build/release/launcher/troupe-run --standalone --nproc-per-node 4 \
  build/release/examples/train/train_demo
