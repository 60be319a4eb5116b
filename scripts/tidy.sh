#!/usr/bin/env bash
# Runs clang-tidy-14 with the repository's .clang-tidy over every project C++ source of a build's
# compile_commands.json (tests, generated files and CUDA sources left out), in parallel over the
# cores; exits 1 on any finding and prints how long it took.
#   scripts/tidy.sh [BUILD_DIR]          # default build/ci; the build must have run (Qt's
#                                        # generated headers are read)
#   OFFSIM_TIDY_JOBS=4 scripts/tidy.sh   # parallel clang-tidy processes (default: nproc)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
root="$PWD"
build="${1:-build/ci}"
jobs="${OFFSIM_TIDY_JOBS:-$(nproc 2>/dev/null || echo 2)}"
tidy="${CLANG_TIDY:-clang-tidy-14}"
if [ ! -f "$build/compile_commands.json" ]; then
  echo "tidy: $build/compile_commands.json not found; configure and build first" \
    "(cmake --preset ci && cmake --build build/ci)" >&2
  exit 2
fi
command -v "$tidy" >/dev/null || { echo "tidy: $tidy not found (scripts/install-deps.sh)" >&2; exit 2; }

# The project's own sources: under the repository, outside the build folder and tests/.
mapfile -t files < <(python3 - "$build/compile_commands.json" "$root" <<'PY'
import json, os, sys
db, root = sys.argv[1], os.path.realpath(sys.argv[2])
seen = set()
for entry in json.load(open(db)):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if rel.startswith("..") or rel.startswith("build") or rel.startswith("tests/"):
        continue
    if not rel.endswith(".cc") or rel in seen:
        continue
    seen.add(rel)
    print(rel)
PY
)
if [ ${#files[@]} -eq 0 ]; then
  echo "tidy: no sources in $build/compile_commands.json" >&2
  exit 2
fi

start=$SECONDS
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# One log per source, printed in source order, so that parallel runs do not interleave.
# GCC-only warning flags of the ci preset are not clang's: they are not findings.
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} sh -c '
  log="$2/$(printf %s "$1" | tr / _).log"
  "$3" -p "$4" --quiet --extra-arg=-Wno-unknown-warning-option "$1" >"$log" 2>&1 \
    || echo "$1" >"$log.failed"' sh {} "$out" "$tidy" "$build"
failed=0
for f in "${files[@]}"; do
  log="$out/$(printf %s "$f" | tr / _).log"
  # clang-tidy's "N warnings generated" lines count the suppressed ones (system headers) too.
  grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^Use -system-headers' \
    "$log" || true
  [ -f "$log.failed" ] && failed=$((failed + 1))
done
# A finding in a header is reported by every source that includes it: counted once.
findings=$(cat "$out"/*.log | grep -E '^[^ ].*:[0-9]+:[0-9]+: (warning|error):' | sort -u | wc -l)
echo "tidy: ${#files[@]} sources, $findings findings ($failed sources failed) in" \
  "$((SECONDS - start)) s with $jobs jobs"
[ "$failed" -eq 0 ] && [ "$findings" -eq 0 ]
