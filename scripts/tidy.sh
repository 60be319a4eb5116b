#!/usr/bin/env bash
# Runs clang-tidy-14 with the repository's .clang-tidy over every project C++ source of a build's
# compile_commands.json (tests, generated files and CUDA sources left out), in parallel over the
# cores, and compares the findings with the ratchet list scripts/tidy-known-findings.txt: exits 1
# on any finding not in the list and on any listed finding that no longer occurs; prints the time.
#   scripts/tidy.sh [BUILD_DIR]          # default build/ci; the build must have run (Qt's
#                                        # generated headers are read)
#   OFFSIM_TIDY_JOBS=4 scripts/tidy.sh   # parallel clang-tidy processes (default: nproc)
#   scripts/tidy.sh --match LOG KNOWN ROOT [SOURCES]
#                                        # only the comparison, on a saved clang-tidy log (paths
#                                        # under ROOT; SOURCES: the checked files, one a line)
set -euo pipefail

# Compares the findings of a clang-tidy log with the known-findings list. A finding's key is
# file:function:check (file relative to ROOT; function as clang-tidy names it in the message, or
# "-" when the message names none), without line numbers, so that edits elsewhere in a file keep
# its key. Listed findings of files that were not checked (SOURCES given and the file not in it,
# e.g. CUDA sources in a build without CUDA) are not reported as gone.
match_findings() {
  python3 - "$@" <<'PY'
import os, re, sys
log, known_path, root = sys.argv[1], sys.argv[2], os.path.realpath(sys.argv[3])
sources = None
if len(sys.argv) > 4:
    sources = {line.strip() for line in open(sys.argv[4]) if line.strip()}
finding = re.compile(r"^(?P<file>[^ ].*?):\d+:\d+: (?:warning|error): (?P<msg>.*) \[(?P<checks>[^\]]+)\]$")
found = set()
for line in open(log, errors="replace"):
    m = finding.match(line.rstrip("\n"))
    if not m:
        continue
    path = m["file"]
    if os.path.isabs(path):
        real = os.path.realpath(path)
        if os.path.commonpath([real, root]) == root:
            path = os.path.relpath(real, root)
    checks = [c for c in m["checks"].split(",") if c and not c.startswith("-")]
    function = re.search(r"function '([^']+)'", m["msg"])
    for check in checks or ["unknown-check"]:
        found.add(f"{path}:{function[1] if function else '-'}:{check}")
known, errors = set(), 0
for number, line in enumerate(open(known_path), 1):
    key = line.strip()
    if not key or key.startswith("#"):
        continue
    if key.count(":") < 2:
        print(f"tidy: {known_path}:{number}: expected file:function:check, got '{key}'")
        errors += 1
    elif key in known:
        print(f"tidy: {known_path}:{number}: '{key}' listed twice")
        errors += 1
    known.add(key)
new = sorted(found - known)
gone = sorted(k for k in known - found if sources is None or k.split(":", 1)[0] in sources)
for key in new:
    print(f"tidy: new finding (fix it; the list only shrinks): {key}")
for key in gone:
    print(f"tidy: listed finding no longer occurs (delete its line from {known_path}): {key}")
print(f"tidy: {len(found)} findings, {len(found & known)} of them listed; {len(new)} new,"
      f" {len(gone)} listed but gone")
sys.exit(1 if new or gone or errors else 0)
PY
}

if [ "${1:-}" = "--match" ]; then
  shift
  [ $# -ge 3 ] || { echo "usage: scripts/tidy.sh --match LOG KNOWN ROOT [SOURCES]" >&2; exit 2; }
  match_findings "$@"
  exit
fi
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
  # Findings are errors (WarningsAsErrors), so clang-tidy fails on them; a source that failed
  # without a finding (a crash, a missing file) fails the stage.
  if [ -f "$log.failed" ] && ! grep -q -E '^[^ ].*:[0-9]+:[0-9]+: (warning|error):' "$log"; then
    echo "tidy: clang-tidy failed on $f without a finding" >&2
    failed=$((failed + 1))
  fi
done
cat "$out"/*.log >"$out/all.txt"
printf '%s\n' "${files[@]}" >"$out/sources.txt"
status=0
match_findings "$out/all.txt" scripts/tidy-known-findings.txt "$root" "$out/sources.txt" || status=1
echo "tidy: ${#files[@]} sources ($failed failed) in $((SECONDS - start)) s with $jobs jobs"
[ "$failed" -eq 0 ] && [ "$status" -eq 0 ]
