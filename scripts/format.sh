#!/usr/bin/env bash
# Formats the tree's C++ sources (.cpp, .hpp, .cu, .c; tracked or new, not ignored) as
# .clang-format says, or with --check changes nothing and fails naming each file that
# differs (the test
# "format: every C++ source is formatted as .clang-format says" runs the check).
#   bash scripts/format.sh [--check]
# Needs clang-format-14 (scripts/install-deps.sh installs it); another version may format
# differently, so it is not used in its place.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=$(command -v clang-format-14 || true)
[[ -n $tool ]] || { echo "format: clang-format-14 is missing; run 'bash scripts/install-deps.sh'" >&2; exit 2; }
# Tracked files and new ones not yet added (ignored ones, such as build/, are left out).
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp' '*.cu' '*.c')
(( ${#files[@]} > 0 )) || { echo "format: no C++ files found; run this in a git checkout of troupe" >&2; exit 2; }
case "${1:-}" in
  "") "$tool" -i "${files[@]}"; echo "format: ${#files[@]} files formatted" ;;
  --check)
    # In batches, side by side: one clang-format per file takes a minute on two cores.
    # A file that differs is named in an "error: code should be clang-formatted" line.
    rc=0
    out=$(printf '%s\0' "${files[@]}" |
          xargs -0 -P "$(nproc)" -n 25 "$tool" --dry-run -Werror 2>&1 > /dev/null) || rc=$?
    mapfile -t bad < <(grep -E '^[^:]+:[0-9]+:[0-9]+: error: code should be clang-formatted' \
                         <<< "$out" | cut -d: -f1 | sort -u)
    if (( ${#bad[@]} > 0 )); then
      printf 'format: not formatted: %s\n' "${bad[@]}" >&2
      echo "format: ${#bad[@]} of ${#files[@]} files differ; run 'bash scripts/format.sh' and commit" >&2
      exit 1
    fi
    if (( rc != 0 )); then
      printf '%s\n' "$out" >&2
      echo "format: clang-format failed (exit $rc) without naming a file that differs; see above" >&2
      exit 1
    fi
    echo "format: all ${#files[@]} files formatted" ;;
  *) echo "format: unknown option '$1'; use --check or nothing" >&2; exit 2 ;;
esac
