#!/usr/bin/env bash
# Installs dependencies, builds the release preset, and runs the main demo job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh release
exec build/release/launcher/troupe-run --standalone --nproc-per-node 4 \
  build/release/examples/rendezvous/rendezvous_demo
