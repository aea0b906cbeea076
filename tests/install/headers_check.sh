#!/usr/bin/env bash
# usage: headers_check.sh BUILD_DIR WORK_DIR CXX [INCLUDE_DIR...]
# Installs BUILD_DIR into WORK_DIR/prefix, then preprocesses every installed header on its
# own, as a user's translation unit would include it, and fails when one pulls in:
#   - Asio or Beast (transports stay inside the libraries), or
#   - CAF outside troupe/actors (only the actors module speaks CAF), or
#   - a detail/ header of another module (a module's internals are its own), or
#   - any detail/ header at all, since none is installed for a public template's sake.
# Each offence is named with the chain of includes that brought it in.
set -euo pipefail
build=$1 work=$2 cxx=$3
shift 3
extra=()
for d in "$@"; do
  # The compiler's own system folders stay where it puts them (#include_next needs that).
  [[ $d == /usr/include || $d == /usr/local/include ]] || extra+=(-isystem "$d")
done
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
inc=$work/prefix/include
mapfile -t headers < <(cd "$inc" && find troupe -name '*.hpp' | sort)
(( ${#headers[@]} > 20 )) || { echo "headers: only ${#headers[@]} headers installed under $inc" >&2; exit 1; }
detail=$(cd "$inc" && find troupe -path '*/detail/*' -name '*.hpp' | sort)
if [[ -n $detail ]]; then
  echo "headers: detail/ headers are installed (no public template needs them):" >&2
  printf '  %s\n' $detail >&2
  exit 1
fi
check_one() {  # header -> prints offences, one per line
  local h=$1 module
  module=$(cut -d/ -f2 <<< "$h")
  [[ $module == *.hpp ]] && module=""
  "$cxx" -std=c++20 -E -H -o /dev/null -I "$inc" "${extra[@]}" -x c++ "$inc/$h" 2> "$work/$(tr / _ <<< "$h").log" ||
    { echo "$h: does not preprocess on its own: $(grep -m1 "error:" "$work/$(tr / _ <<< "$h").log")"; return; }
  # -H prints one line per include, dots giving the depth.
  awk -v h="$h" -v module="$module" -v inc="$inc/" '
    /^\.+ / {
      depth = index($0, " ") - 1; path = substr($0, depth + 2)
      if (index(path, inc) == 1) path = substr(path, length(inc) + 1)
      chain[depth] = path
      bad = ""
      if (path ~ /boost\/(asio|beast)/) bad = "Asio/Beast"
      else if (path ~ /(^|\/)caf\// && module != "actors") bad = "CAF"
      else if (match(path, /troupe\/[a-z_]+\/detail\//)) {
        split(substr(path, RSTART), p, "/")
        if (module == "" || p[2] != module) bad = "another module'"'"'s detail/ header"
      }
      if (bad != "") {
        via = h; for (i = 1; i < depth; i++) via = via " -> " chain[i]
        print h ": includes " bad " " path " (via " via ")"
        exit
      }
    }' "$work/$(tr / _ <<< "$h").log"
}
fails=$(for h in "${headers[@]}"; do check_one "$h"; done)
if [[ -n $fails ]]; then
  echo "$fails" >&2
  echo "headers: $(wc -l <<< "$fails") of ${#headers[@]} installed headers pull in internals; move them behind a .cpp or a forward declaration" >&2
  exit 1
fi
echo "headers: all ${#headers[@]} installed headers preprocess on their own without Asio, Beast, CAF (outside actors) or another module's internals"
