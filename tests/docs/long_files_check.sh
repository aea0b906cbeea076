#!/usr/bin/env bash
# Every library source file (the modules' .cpp and .hpp, not tests, benchmarks or
# examples) longer than LIMIT lines says why at its top: a comment line starting
# "// Why this file is long" within its first 12 lines (docs/architecture.md, "Files
# longer than about 600 lines"). Prints each offender and what to do.
#   long_files_check.sh <source dir> [LIMIT=600]
set -euo pipefail
src=$1
limit=${2:-600}
modules=(core store membership devicemap rpc collectives actors training world launcher)
bad=0 long=0
for m in "${modules[@]}"; do
  [[ -d $src/$m ]] || { echo "long_files_check: $src/$m is missing; pass the source root" >&2; exit 2; }
  while IFS= read -r -d '' f; do
    n=$(wc -l < "$f")
    (( n > limit )) || continue
    long=$((long + 1))
    if ! head -n 12 "$f" | grep -q '^// Why this file is long'; then
      echo "${f#"$src"/}: $n lines and no '// Why this file is long' at its top; split it or say why" >&2
      bad=$((bad + 1))
    fi
  done < <(find "$src/$m" -type f \( -name '*.cpp' -o -name '*.hpp' \) -print0)
done
echo "$long library files over $limit lines; $bad without a reason"
(( bad == 0 ))
